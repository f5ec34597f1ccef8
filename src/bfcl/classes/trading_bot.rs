//! `TradingBot`: a stock-trading account with orders, a watchlist and a transaction history.
//!
//! Observed reference behaviour (BFCL trace README, "TradingBot", and the traces): digit-string
//! order keys from the scenario become ints while other keys (the stray `"order_type"`) stay;
//! `place_order` checks the symbol, then `price <= 0 or amount <= 0` (so a string raises
//! CPython's comparison `TypeError`), then `order_type.lower()`, then funds for buys only; it
//! answers `Pending` but stores `Open` and leaves the balance alone. Deposits and withdrawals
//! are stamped `CURRENT_TIME` plus a `randint` offset within 24 h from
//! `random.Random(1053520)`. With `long_context`, the watchlist, stock info, order details,
//! sector lists and transaction history carry the extension data; the stored state does not.

use serde_json::{Map, Value};

use super::long_context::constant;
use super::{cfg, error_dict, snapshot_of, strptime_ymd as parse_date, PythonClass};
use crate::bfcl::exception::PyErr;
use crate::bfcl::ops::{arith, compare, lower, py_float, py_iter, ArithOp, CmpOp};
use crate::bfcl::pyrandom::PyRandom;
use crate::bfcl::signature::{opt, req, Bound, Param};
use crate::bfcl::value::{PyDict, PyValue};

const CLASS: &str = "TradingBot";
const METHODS: &[&str] = &[
    "add_to_watchlist",
    "cancel_order",
    "filter_stocks_by_price",
    "fund_account",
    "get_account_info",
    "get_available_stocks",
    "get_current_time",
    "get_order_details",
    "get_order_history",
    "get_stock_info",
    "get_symbol_by_name",
    "get_transaction_history",
    "get_watchlist",
    "notify_price_change",
    "place_order",
    "remove_stock_from_watchlist",
    "trading_get_login_status",
    "trading_login",
    "trading_logout",
    "withdraw_funds",
];
const DEFAULT_SEED: i64 = 1_053_520;
/// `CURRENT_TIME` (2024-09-01 10:30:00, naive, evaluated under `TZ=UTC`) as Unix seconds.
const CURRENT_TIME_UNIX: i64 = 1_725_186_600;

/// Company names `get_symbol_by_name` knows (reference guess where the traces are silent:
/// every probe name misses).
const SYMBOLS: &[(&str, &str)] = &[
    ("Apple", "AAPL"),
    ("Google", "GOOG"),
    ("Tesla", "TSLA"),
    ("Microsoft", "MSFT"),
    ("Nvidia", "NVDA"),
    ("Zeta Corp", "ZETA"),
    ("Alpha Tech", "ALPH"),
    ("Omega Industries", "OMEG"),
    ("Quasar Ltd.", "QUAS"),
    ("Neptune Systems", "NEPT"),
    ("Synex Solutions", "SYNX"),
    ("Amazon", "AMZN"),
];

/// The trading account's compared state plus its generator.
#[derive(Debug, Clone)]
pub struct TradingBot {
    orders: PyDict,
    account_info: PyValue,
    authenticated: PyValue,
    market_status: PyValue,
    order_counter: PyValue,
    stocks: PyDict,
    watch_list: Vec<PyValue>,
    transaction_history: Vec<PyValue>,
    long_context: bool,
    random: PyRandom,
}

fn default_state() -> PyDict {
    const DEFAULTS: &str = r#"{
 "orders": {"12345": {"id": 12345, "order_type": "Buy", "symbol": "AAPL", "price": 210.65, "amount": 10, "status": "Completed"},
            "12446": {"id": 12446, "order_type": "Sell", "symbol": "GOOG", "price": 2840.56, "amount": 5, "status": "Pending"}},
 "account_info": {"account_id": 12345, "balance": 10000.0, "binding_card": 1974202140965533},
 "authenticated": false, "market_status": "Closed", "order_counter": 12446,
 "stocks": {
  "AAPL": {"price": 227.16, "percent_change": 0.17, "volume": 2.552, "MA(5)": 227.11, "MA(20)": 227.09},
  "GOOG": {"price": 2840.34, "percent_change": 0.24, "volume": 1.123, "MA(5)": 2835.67, "MA(20)": 2842.15},
  "TSLA": {"price": 667.92, "percent_change": -0.12, "volume": 1.654, "MA(5)": 671.15, "MA(20)": 668.2},
  "MSFT": {"price": 310.23, "percent_change": 0.09, "volume": 3.234, "MA(5)": 309.88, "MA(20)": 310.11},
  "NVDA": {"price": 220.34, "percent_change": 0.34, "volume": 1.234, "MA(5)": 220.45, "MA(20)": 220.67},
  "ALPH": {"price": 1320.45, "percent_change": -0.08, "volume": 1.567, "MA(5)": 1321.12, "MA(20)": 1325.78},
  "OMEG": {"price": 457.23, "percent_change": 0.12, "volume": 2.345, "MA(5)": 456.78, "MA(20)": 458.12},
  "QUAS": {"price": 725.89, "percent_change": -0.03, "volume": 1.789, "MA(5)": 726.45, "MA(20)": 728.0},
  "NEPT": {"price": 88.34, "percent_change": 0.19, "volume": 0.654, "MA(5)": 88.21, "MA(20)": 88.67},
  "SYNX": {"price": 345.67, "percent_change": 0.11, "volume": 2.112, "MA(5)": 345.34, "MA(20)": 346.12},
  "ZETA": {"price": 22.09, "percent_change": -0.05, "volume": 0.789, "MA(5)": 22.12, "MA(20)": 22.34}},
 "watch_list": ["NVDA"], "transaction_history": []
}"#;
    // A compile-time constant, checked by the unit test below.
    match serde_json::from_str::<Value>(DEFAULTS).map(|v| PyValue::from_json(&v)) {
        Ok(PyValue::Dict(d)) => d,
        _ => PyDict::new(),
    }
}

fn dict_of(v: PyValue) -> PyDict {
    match v {
        PyValue::Dict(d) => d,
        _ => PyDict::new(),
    }
}

fn list_of(v: PyValue) -> Vec<PyValue> {
    match v {
        PyValue::List(l) => l,
        _ => Vec::new(),
    }
}

/// Civil date from days since 1970-01-01 (proleptic Gregorian).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// `"%Y-%m-%d %H:%M:%S"` of Unix seconds (UTC).
fn format_timestamp(unix: i64) -> String {
    let (days, secs) = (unix.div_euclid(86_400), unix.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

impl TradingBot {
    /// Loads the scenario; missing keys take `DEFAULT_STATE`.
    pub fn load(config: &PyDict, long_context: bool) -> Self {
        let defaults = default_state();
        let get = |k: &str| cfg(config, k, cfg(&defaults, k, PyValue::None));
        let seed = match config.get_str("random_seed") {
            Some(PyValue::Int(s)) => *s,
            _ => DEFAULT_SEED,
        };
        let orders = dict_of(get("orders"))
            .iter()
            .map(|(k, v)| {
                let key = match k {
                    PyValue::Str(s) if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) => {
                        s.parse::<i64>().map_or_else(|_| k.clone(), PyValue::Int)
                    }
                    _ => k.clone(),
                };
                (key, v.clone())
            })
            .collect();
        Self {
            orders,
            account_info: get("account_info"),
            authenticated: get("authenticated"),
            market_status: get("market_status"),
            order_counter: get("order_counter"),
            stocks: dict_of(get("stocks")),
            watch_list: list_of(get("watch_list")),
            transaction_history: list_of(get("transaction_history")),
            long_context,
            random: PyRandom::new(seed),
        }
    }

    fn authed(&self) -> bool {
        self.authenticated.truthy()
    }

    fn balance(&self) -> PyValue {
        match &self.account_info {
            PyValue::Dict(d) => d.get_str("balance").cloned().unwrap_or(PyValue::None),
            _ => PyValue::None,
        }
    }

    fn set_balance(&mut self, v: PyValue) {
        if let PyValue::Dict(d) = &mut self.account_info {
            d.insert(PyValue::str("balance"), v);
        }
    }

    fn timestamp(&mut self) -> String {
        // `CURRENT_TIME + (randint(start, start + 86400) - start)` seconds; the draw is
        // `start + _randbelow(86401)`, so only the offset matters.
        let offset = self.random.randint(0, 86_400);
        format_timestamp(CURRENT_TIME_UNIX + offset)
    }

    fn money(v: &PyValue) -> Result<String, PyErr> {
        Ok(format!("{:.2}", py_float(v)?))
    }

    fn place_order(&mut self, a: &[PyValue]) -> Result<PyValue, PyErr> {
        let (order_type, symbol, price, amount) = (&a[0], &a[1], &a[2], &a[3]);
        if !self.authed() {
            return Ok(error_dict(
                "User not authenticated. Please log in to place an order.",
            ));
        }
        if !self.stocks.contains_key(symbol) {
            return Ok(error_dict(format!(
                "Invalid stock symbol: {}",
                symbol.to_py_str()
            )));
        }
        let zero = PyValue::Int(0);
        if compare(CmpOp::Le, price, &zero)? || compare(CmpOp::Le, amount, &zero)? {
            return Ok(error_dict("Price and amount must be positive values."));
        }
        let price = PyValue::Float(py_float(price)?);
        if lower(order_type)? == "buy" {
            let required = arith(ArithOp::Mul, &price, amount)?;
            let balance = self.balance();
            if compare(CmpOp::Gt, &required, &balance)? {
                return Ok(error_dict(format!(
                    "Insufficient funds: required ${} but only ${} available.",
                    Self::money(&required)?,
                    Self::money(&balance)?
                )));
            }
        }
        let id = self.order_counter.clone();
        self.orders.insert(
            id.clone(),
            PyValue::dict([
                ("id", id.clone()),
                ("order_type", order_type.clone()),
                ("symbol", symbol.clone()),
                ("price", price.clone()),
                ("amount", amount.clone()),
                ("status", PyValue::str("Open")),
            ]),
        );
        self.order_counter = arith(ArithOp::Add, &self.order_counter, &PyValue::Int(1))?;
        Ok(PyValue::dict([
            ("order_id", id),
            ("order_type", order_type.clone()),
            ("status", PyValue::str("Pending")),
            ("price", price),
            ("amount", amount.clone()),
        ]))
    }

    fn order_details(&self, order_id: &PyValue) -> PyValue {
        let Some(order) = self.orders.get(order_id) else {
            let ids = PyValue::List(self.orders.keys().cloned().collect());
            return error_dict(format!(
                "Order with ID {} not found.Here is the list of orders_id: {}",
                order_id.to_py_str(),
                ids.repr()
            ));
        };
        let mut order = order.clone();
        if self.long_context {
            if let PyValue::Dict(d) = &mut order {
                let symbol = d
                    .get_str("symbol")
                    .map(PyValue::to_py_str)
                    .unwrap_or_default();
                let metadata: PyDict = dict_of(constant("ORDER_DETAIL_EXTENSION"))
                    .iter()
                    .map(|(k, v)| {
                        let text = v.to_py_str().replace("{symbol}", &symbol);
                        (k.clone(), PyValue::Str(text))
                    })
                    .collect();
                d.insert(PyValue::str("metadata"), PyValue::Dict(metadata));
            }
        }
        order
    }

    fn transaction_history(&self, start: &PyValue, end: &PyValue) -> Result<PyValue, PyErr> {
        if !self.authed() {
            return Ok(PyValue::List(vec![error_dict(
                "User not authenticated. Please log in to view transaction history.",
            )]));
        }
        let start = if start.truthy() {
            Some(parse_date(start)?)
        } else {
            None
        };
        let end = if end.truthy() {
            Some(parse_date(end)?)
        } else {
            None
        };
        let mut rows: Vec<PyValue> = self
            .transaction_history
            .iter()
            .filter(|t| {
                let date = match t {
                    PyValue::Dict(d) => d.get_str("timestamp").map(PyValue::to_py_str),
                    _ => None,
                };
                let Some(date) =
                    date.and_then(|s| s.get(..10).and_then(|d| parse_date(&PyValue::str(d)).ok()))
                else {
                    return start.is_none() && end.is_none();
                };
                start.is_none_or(|s| s <= date) && end.is_none_or(|e| date <= e)
            })
            .cloned()
            .collect();
        if self.long_context {
            rows.extend(list_of(constant("TRANSACTION_HISTORY_EXTENSION")));
        }
        Ok(PyValue::dict([(
            "transaction_history",
            PyValue::List(rows),
        )]))
    }

    fn record(&mut self, kind: &str, amount: &PyValue) {
        let timestamp = self.timestamp();
        self.transaction_history.push(PyValue::dict([
            ("type", PyValue::str(kind)),
            ("amount", amount.clone()),
            ("timestamp", PyValue::Str(timestamp)),
        ]));
    }

    fn dispatch(&mut self, method: &str, a: &[Option<PyValue>]) -> Result<PyValue, PyErr> {
        let arg = |i: usize| a.get(i).cloned().flatten().unwrap_or(PyValue::None);
        let one = |k: &str, v: PyValue| Ok(PyValue::dict([(k, v)]));
        match method {
            "get_current_time" => one("current_time", PyValue::str("10:30 AM")),
            "get_symbol_by_name" => {
                let name = arg(0);
                let symbol = SYMBOLS
                    .iter()
                    .find(|(n, _)| name.py_eq(&PyValue::str(*n)))
                    .map_or("Stock not found", |(_, s)| s);
                one("symbol", PyValue::str(symbol))
            }
            "get_stock_info" => {
                let symbol = arg(0);
                let Some(info) = self.stocks.get(&symbol) else {
                    return Ok(error_dict(format!(
                        "Stock with symbol '{}' not found.",
                        symbol.to_py_str()
                    )));
                };
                let mut info = info.clone();
                if self.long_context {
                    if let PyValue::Dict(d) = &mut info {
                        d.insert(PyValue::str("MA(5)"), constant("MA_5_EXTENSION"));
                        d.insert(PyValue::str("MA(20)"), constant("MA_20_EXTENSION"));
                    }
                }
                Ok(info)
            }
            "get_available_stocks" => {
                let sector = arg(0);
                let base: &[&str] = if sector.py_eq(&PyValue::str("Technology")) {
                    &["AAPL", "GOOG", "MSFT", "NVDA"]
                } else if sector.py_eq(&PyValue::str("Automobile")) {
                    &["TSLA", "F", "GM"]
                } else {
                    &[]
                };
                let mut list: Vec<PyValue> = base.iter().map(|s| PyValue::str(*s)).collect();
                if self.long_context && !base.is_empty() {
                    let ext = if base[0] == "AAPL" {
                        "TECHNOLOGY_EXTENSION"
                    } else {
                        "AUTOMOBILE_EXTENSION"
                    };
                    list.extend(list_of(constant(ext)));
                }
                one("stock_list", PyValue::List(list))
            }
            "filter_stocks_by_price" => {
                let (min, max) = (arg(1), arg(2));
                let mut kept = Vec::new();
                for s in py_iter(&arg(0))? {
                    let price = match self.stocks.get(&s) {
                        Some(PyValue::Dict(d)) => {
                            d.get_str("price").cloned().unwrap_or(PyValue::Int(0))
                        }
                        _ => PyValue::Int(0),
                    };
                    if compare(CmpOp::Le, &min, &price)? && compare(CmpOp::Le, &price, &max)? {
                        kept.push(s);
                    }
                }
                one("filtered_stocks", PyValue::List(kept))
            }
            "notify_price_change" => {
                let threshold = arg(1);
                let mut hits = Vec::new();
                for s in py_iter(&arg(0))? {
                    if let Some(PyValue::Dict(d)) = self.stocks.get(&s) {
                        let change = d
                            .get_str("percent_change")
                            .cloned()
                            .unwrap_or(PyValue::None);
                        let abs = PyValue::Float(py_float(&change)?.abs());
                        if compare(CmpOp::Ge, &abs, &threshold)? {
                            hits.push(s.to_py_str());
                        }
                    }
                }
                let text = if hits.is_empty() {
                    "No significant price changes in the selected stocks.".to_string()
                } else {
                    format!("Stocks {} have significant price changes.", hits.join(", "))
                };
                one("notification", PyValue::Str(text))
            }
            "place_order" => {
                let args: Vec<PyValue> = (0..4).map(arg).collect();
                self.place_order(&args)
            }
            "get_order_details" => Ok(self.order_details(&arg(0))),
            "cancel_order" => {
                let id = arg(0);
                let Some(PyValue::Dict(order)) = self.orders.get_mut(&id) else {
                    return Ok(error_dict(format!(
                        "Order with ID {} not found.",
                        id.to_py_str()
                    )));
                };
                if order
                    .get_str("status")
                    .is_some_and(|s| s.py_eq(&PyValue::str("Completed")))
                {
                    return Ok(error_dict(format!(
                        "Can't cancel order {}. Order is already completed.",
                        id.to_py_str()
                    )));
                }
                order.insert(PyValue::str("status"), PyValue::str("Cancelled"));
                Ok(PyValue::dict([
                    ("order_id", id),
                    ("status", PyValue::str("Cancelled")),
                ]))
            }
            "get_account_info" => {
                if !self.authed() {
                    return Ok(error_dict(
                        "User not authenticated. Please log in to view account information.",
                    ));
                }
                Ok(self.account_info.clone())
            }
            "trading_login" => {
                if self.authed() {
                    return one("status", PyValue::str("Already logged in"));
                }
                self.authenticated = PyValue::Bool(true);
                one("status", PyValue::str("Logged in successfully"))
            }
            "trading_get_login_status" => one("status", PyValue::Bool(self.authed())),
            "trading_logout" => {
                if !self.authed() {
                    return one("status", PyValue::str("No user is currently logged in"));
                }
                self.authenticated = PyValue::Bool(false);
                one("status", PyValue::str("Logged out successfully"))
            }
            "fund_account" => {
                let amount = arg(0);
                if !self.authed() {
                    return Ok(error_dict(
                        "User not authenticated. Please log in to fund the account.",
                    ));
                }
                if compare(CmpOp::Le, &amount, &PyValue::Int(0))? {
                    return Ok(error_dict("Funding amount must be positive."));
                }
                let balance = arith(ArithOp::Add, &self.balance(), &amount)?;
                self.set_balance(balance.clone());
                self.record("deposit", &amount);
                Ok(PyValue::dict([
                    ("status", PyValue::str("Account funded successfully")),
                    ("new_balance", balance),
                ]))
            }
            "withdraw_funds" => {
                let amount = arg(0);
                if !self.authed() {
                    return Ok(error_dict(
                        "User not authenticated. Please log in to withdraw funds.",
                    ));
                }
                if !self.market_status.py_eq(&PyValue::str("Open")) {
                    return Ok(error_dict("Market is closed. Withdrawals are not allowed."));
                }
                if compare(CmpOp::Le, &amount, &PyValue::Int(0))? {
                    return Ok(error_dict("Withdrawal amount must be positive."));
                }
                if compare(CmpOp::Gt, &amount, &self.balance())? {
                    return Ok(error_dict("Insufficient funds for withdrawal."));
                }
                let balance = arith(ArithOp::Sub, &self.balance(), &amount)?;
                self.set_balance(balance.clone());
                self.record("withdrawal", &amount);
                Ok(PyValue::dict([
                    ("status", PyValue::str("Withdrawal successful")),
                    ("new_balance", balance),
                ]))
            }
            "get_order_history" => {
                if !self.authed() {
                    return Ok(PyValue::List(vec![error_dict(
                        "User not authenticated. Please log in to view order history.",
                    )]));
                }
                one(
                    "history",
                    PyValue::List(self.orders.keys().cloned().collect()),
                )
            }
            "get_transaction_history" => self.transaction_history(&arg(0), &arg(1)),
            "get_watchlist" => {
                if !self.authed() {
                    return Ok(PyValue::List(vec![PyValue::str(
                        "Error: User not authenticated. Please log in to view watchlist.",
                    )]));
                }
                if self.long_context {
                    let mut list = self.watch_list.clone();
                    list.extend(list_of(constant("WATCH_LIST_EXTENSION")));
                    return Ok(PyValue::List(list));
                }
                one("watchlist", PyValue::List(self.watch_list.clone()))
            }
            "add_to_watchlist" => {
                let stock = arg(0);
                if !self.watch_list.iter().any(|s| s.py_eq(&stock))
                    && self.stocks.contains_key(&stock)
                {
                    self.watch_list.push(stock);
                }
                one("watchlist", PyValue::List(self.watch_list.clone()))
            }
            "remove_stock_from_watchlist" => {
                let symbol = arg(0);
                if !self.authed() {
                    return Ok(error_dict(
                        "User not authenticated. Please log in to modify the watchlist.",
                    ));
                }
                let Some(i) = self.watch_list.iter().position(|s| s.py_eq(&symbol)) else {
                    return Ok(error_dict(format!(
                        "Stock {} not found in watchlist.",
                        symbol.to_py_str()
                    )));
                };
                self.watch_list.remove(i);
                one(
                    "status",
                    PyValue::Str(format!(
                        "Stock {} removed from watchlist successfully.",
                        symbol.to_py_str()
                    )),
                )
            }
            _ => Err(PyErr::no_attribute(&PyValue::None, method)),
        }
    }
}

fn params(method: &str) -> &'static [Param] {
    const ORDER: [Param; 4] = [
        req("order_type"),
        req("symbol"),
        req("price"),
        req("amount"),
    ];
    const FILTER: [Param; 3] = [req("stocks"), req("min_price"), req("max_price")];
    const NOTIFY: [Param; 2] = [req("stocks"), req("threshold")];
    const LOGIN: [Param; 2] = [req("username"), req("password")];
    const HISTORY: [Param; 2] = [opt("start_date"), opt("end_date")];
    match method {
        "add_to_watchlist" => {
            const P: &[Param] = &[req("stock")];
            P
        }
        "cancel_order" | "get_order_details" => {
            const P: &[Param] = &[req("order_id")];
            P
        }
        "filter_stocks_by_price" => &FILTER,
        "fund_account" | "withdraw_funds" => {
            const P: &[Param] = &[req("amount")];
            P
        }
        "get_available_stocks" => {
            const P: &[Param] = &[req("sector")];
            P
        }
        "get_stock_info" | "remove_stock_from_watchlist" => {
            const P: &[Param] = &[req("symbol")];
            P
        }
        "get_symbol_by_name" => {
            const P: &[Param] = &[req("name")];
            P
        }
        "get_transaction_history" => &HISTORY,
        "notify_price_change" => &NOTIFY,
        "place_order" => &ORDER,
        "trading_login" => &LOGIN,
        _ => &[],
    }
}

impl PythonClass for TradingBot {
    const CLASS: &'static str = CLASS;
    const METHODS: &'static [&'static str] = METHODS;

    fn params(method: &str) -> &'static [Param] {
        params(method)
    }

    fn call_bound(&mut self, method: &str, bound: Bound) -> Result<PyValue, PyErr> {
        self.dispatch(method, &bound.into_values())
    }

    fn vars(&self) -> Map<String, Value> {
        let orders = PyValue::Dict(self.orders.clone());
        let stocks = PyValue::Dict(self.stocks.clone());
        let watch_list = PyValue::List(self.watch_list.clone());
        let history = PyValue::List(self.transaction_history.clone());
        let long_context = PyValue::Bool(self.long_context);
        snapshot_of(&[
            ("orders", &orders),
            ("account_info", &self.account_info),
            ("authenticated", &self.authenticated),
            ("market_status", &self.market_status),
            ("order_counter", &self.order_counter),
            ("stocks", &stocks),
            ("watch_list", &watch_list),
            ("transaction_history", &history),
            ("long_context", &long_context),
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_parse_and_timestamps_format() {
        let d = default_state();
        assert_eq!(d.len(), 8);
        assert_eq!(format_timestamp(CURRENT_TIME_UNIX), "2024-09-01 10:30:00");
        let bot = TradingBot::load(&PyDict::new(), false);
        assert!(bot.orders.contains_key(&PyValue::Int(12446)));
    }

    #[test]
    fn strptime_messages() {
        assert_eq!(parse_date(&PyValue::str("2024-09-01")), Ok((2024, 9, 1)));
        let e = parse_date(&PyValue::str("probe_value")).unwrap_err();
        assert_eq!(
            e.message,
            "time data 'probe_value' does not match format '%Y-%m-%d'"
        );
    }
}
