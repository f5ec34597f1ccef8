//! `TravelAPI`: flight booking with an access token, registered credit cards, invoices,
//! insurance and currency exchange.
//!
//! Observed reference behaviour (BFCL trace README, "TravelAPI", and the traces): one
//! `random.Random(141053)` is drawn in call order for tokens (6 digits), card ids (12) and
//! balances (5), booking (7) and transaction (8) ids and insurance ids (9); a flight costs
//! the route's base cost × the class factor (1/2/5), doubled when the digit sum of the date is
//! even; `book_flight` checks token, card, airports, date, class, route, funds and budget in
//! that order and catches the cost lookup's `ValueError`; `purchase_insurance` compares the
//! budget limit with the cost before looking at the booking and the card; the reverse exchange direction
//! divides and rounds to 2 decimals; `verify_traveler_information` checks the name, then the
//! age against the frozen date 2024-09-01, then a `US` passport. With `long_context` the
//! extension cards and bookings are merged into the state at load, `get_flight_cost` answers
//! the costs of every route and `book_flight` returns the whole booking record.
//!
//! The route table holds the routes the traces use (their base costs follow from the
//! results); the reference has more, whose pairs the traces do not reveal.

use serde_json::{Map, Value};

use super::long_context::constant;
use super::{cfg, error_dict, snapshot_of, strptime_ymd, PythonClass};
use crate::bfcl::exception::PyErr;
use crate::bfcl::ops::{arith, compare, py_float, py_iter, ArithOp, CmpOp};
use crate::bfcl::pyrandom::PyRandom;
use crate::bfcl::signature::{opt, req, Bound, Param};
use crate::bfcl::value::{PyDict, PyValue};

const CLASS: &str = "TravelAPI";
const METHODS: &[&str] = &[
    "authenticate_travel",
    "book_flight",
    "cancel_booking",
    "compute_exchange_rate",
    "contact_customer_support",
    "get_all_credit_cards",
    "get_booking_history",
    "get_budget_fiscal_year",
    "get_credit_card_balance",
    "get_flight_cost",
    "get_nearest_airport_by_city",
    "list_all_airports",
    "purchase_insurance",
    "register_credit_card",
    "retrieve_invoice",
    "set_budget_limit",
    "travel_get_login_status",
    "verify_traveler_information",
];
const DEFAULT_SEED: i64 = 141_053;
/// The frozen `datetime.today()` of the reference traces.
const TODAY: (i64, i64, i64) = (2024, 9, 1);

const AIRPORTS: &[&str] = &[
    "RMS", "SBK", "MPC", "SVP", "SHD", "CDG", "LHR", "SSV", "OKD", "WLB", "PEK", "HND", "HKG",
    "CIA", "CRH", "ATV", "PHV", "GFD", "SFO", "LAX", "JFK", "ORD", "BOS",
];

/// City → nearest airport (the cities of the `location` enum, in airport-list order).
const CITY_AIRPORTS: &[(&str, &str)] = &[
    ("Rivermist", "RMS"),
    ("Stonebrook", "SBK"),
    ("Maplecrest", "MPC"),
    ("Silverpine", "SVP"),
    ("Shadowridge", "SHD"),
    ("London", "LHR"),
    ("Paris", "CDG"),
    ("Sunset Valley", "SSV"),
    ("Oakendale", "OKD"),
    ("Willowbend", "WLB"),
    ("Crescent Hollow", "CRH"),
    ("Autumnville", "ATV"),
    ("Pinehaven", "PHV"),
    ("Greenfield", "GFD"),
    ("San Francisco", "SFO"),
    ("Los Angeles", "LAX"),
    ("New York", "JFK"),
    ("Chicago", "ORD"),
    ("Boston", "BOS"),
    ("Beijing", "PEK"),
    ("Hong Kong", "HKG"),
    ("Rome", "CIA"),
    ("Tokyo", "HND"),
];

/// Base (economy, odd-date) costs of the routes the traces reach.
const ROUTES: &[(&str, &str, f64)] = &[
    ("RMS", "SBK", 220.0),
    ("SFO", "LAX", 200.0),
    ("SFO", "ORD", 400.0),
    ("RMS", "GFD", 320.0),
    ("ORD", "LAX", 180.0),
    ("LAX", "JFK", 600.0),
    ("CRH", "PHV", 250.0),
    ("JFK", "LAX", 570.0),
    ("RMS", "JFK", 210.0),
    ("CRH", "HKG", 290.0),
    ("CRH", "RMS", 280.0),
    ("RMS", "LAX", 330.0),
    ("SFO", "BOS", 450.0),
    ("JFK", "PEK", 1000.0),
    ("SFO", "CIA", 700.0),
    ("LAX", "HND", 430.0),
    ("CRH", "JFK", 300.0),
    ("ORD", "SVP", 380.0),
    ("JFK", "HND", 800.0),
    ("OKD", "LAX", 220.0),
    ("LAX", "SFO", 100.0),
    ("JFK", "MPC", 470.0),
    ("RMS", "BOS", 200.0),
    ("LHR", "CDG", 100.0),
];

/// The base costs of all 153 reference routes, in the reference's table order (what the
/// long-context `get_flight_cost` scales and returns).
const ALL_ROUTE_COSTS: &[f64] = &[
    200.0, 500.0, 400.0, 450.0, 300.0, 350.0, 370.0, 320.0, 330.0, 340.0, 360.0, 310.0, 380.0,
    390.0, 420.0, 430.0, 700.0, 100.0, 600.0, 500.0, 550.0, 310.0, 320.0, 330.0, 340.0, 350.0,
    360.0, 370.0, 380.0, 390.0, 400.0, 410.0, 420.0, 430.0, 300.0, 250.0, 450.0, 460.0, 470.0,
    480.0, 490.0, 500.0, 510.0, 520.0, 530.0, 540.0, 550.0, 560.0, 570.0, 800.0, 950.0, 1000.0,
    180.0, 200.0, 350.0, 360.0, 370.0, 380.0, 390.0, 400.0, 410.0, 420.0, 430.0, 440.0, 450.0,
    460.0, 400.0, 410.0, 420.0, 430.0, 440.0, 450.0, 460.0, 470.0, 480.0, 490.0, 500.0, 510.0,
    200.0, 210.0, 220.0, 230.0, 240.0, 250.0, 260.0, 270.0, 280.0, 290.0, 300.0, 310.0, 320.0,
    330.0, 200.0, 210.0, 220.0, 230.0, 240.0, 250.0, 260.0, 270.0, 280.0, 290.0, 210.0, 220.0,
    230.0, 240.0, 250.0, 260.0, 270.0, 280.0, 290.0, 230.0, 240.0, 250.0, 260.0, 270.0, 280.0,
    290.0, 300.0, 220.0, 230.0, 240.0, 250.0, 260.0, 270.0, 280.0, 240.0, 250.0, 260.0, 270.0,
    280.0, 290.0, 230.0, 240.0, 250.0, 260.0, 270.0, 250.0, 260.0, 270.0, 280.0, 240.0, 250.0,
    260.0, 270.0, 280.0, 290.0, 300.0, 230.0, 240.0, 220.0, 100.0, 220.0,
];

/// Exchange rates `base → target`; the reverse direction divides. USD→EUR/GBP/RMB are
/// confirmed by the traces, the others are the reference's documented currency set with
/// guessed rates.
fn exchange_rates() -> [(&'static str, &'static str, PyValue); 10] {
    let f = PyValue::Float;
    let i = PyValue::Int;
    [
        ("USD", "RMB", i(7)),
        ("USD", "EUR", f(0.8)),
        ("USD", "JPY", i(110)),
        ("USD", "GBP", f(0.7)),
        ("USD", "CAD", f(1.3)),
        ("USD", "AUD", f(1.4)),
        ("USD", "INR", i(70)),
        ("USD", "RUB", i(60)),
        ("USD", "BRL", f(3.8)),
        ("USD", "MXN", i(20)),
    ]
}

/// The travel service's compared state plus its generator.
#[derive(Debug, Clone)]
pub struct TravelApi {
    credit_card_list: PyDict,
    booking_record: PyDict,
    access_token: PyValue,
    token_type: PyValue,
    token_expires_in: PyValue,
    token_scope: PyValue,
    user_first_name: PyValue,
    user_last_name: PyValue,
    budget_limit: PyValue,
    long_context: bool,
    random: PyRandom,
}

fn dict_of(v: PyValue) -> PyDict {
    match v {
        PyValue::Dict(d) => d,
        _ => PyDict::new(),
    }
}

fn field<'a>(v: &'a PyValue, key: &str) -> Result<&'a PyValue, PyErr> {
    match v {
        PyValue::Dict(d) => d
            .get_str(key)
            .ok_or_else(|| PyErr::key_error(&PyValue::str(key))),
        other => Err(PyErr::type_error(format!(
            "'{}' object is not subscriptable",
            other.type_name()
        ))),
    }
}

/// `round(x, 2)` (exact decimal rounding of the binary value).
fn round2(x: f64) -> f64 {
    format!("{x:.2}").parse().unwrap_or(x)
}

impl TravelApi {
    /// Loads the scenario; missing keys are empty or `None`. With `long_context`, the
    /// extension cards and bookings are merged in (`dict.update`).
    pub fn load(config: &PyDict, long_context: bool) -> Self {
        let seed = match config.get_str("random_seed") {
            Some(PyValue::Int(s)) => *s,
            _ => DEFAULT_SEED,
        };
        let mut credit_card_list = dict_of(cfg(config, "credit_card_list", PyValue::None));
        let mut booking_record = dict_of(cfg(config, "booking_record", PyValue::None));
        if long_context {
            for (k, v) in dict_of(constant("CREDIT_CARD_EXTENSION")).iter() {
                credit_card_list.insert(k.clone(), v.clone());
            }
            for (k, v) in dict_of(constant("BOOKING_RECORD_EXTENSION")).iter() {
                booking_record.insert(k.clone(), v.clone());
            }
        }
        let get = |k: &str| cfg(config, k, PyValue::None);
        Self {
            credit_card_list,
            booking_record,
            access_token: get("access_token"),
            token_type: get("token_type"),
            token_expires_in: get("token_expires_in"),
            token_scope: get("token_scope"),
            user_first_name: get("user_first_name"),
            user_last_name: get("user_last_name"),
            budget_limit: get("budget_limit"),
            long_context,
            random: PyRandom::new(seed),
        }
    }

    fn token_ok(&self, token: &PyValue) -> bool {
        self.access_token.py_eq(token)
    }

    fn id(&mut self, lo: i64, hi: i64) -> PyValue {
        PyValue::Str(self.random.randint(lo, hi).to_string())
    }

    /// `get_flight_cost`'s cost for one route (the non-long-context path).
    fn flight_cost(
        &self,
        from: &PyValue,
        to: &PyValue,
        date: &PyValue,
        class: &PyValue,
    ) -> Result<Vec<f64>, PyErr> {
        let route = ROUTES
            .iter()
            .find(|(a, b, _)| from.py_eq(&PyValue::str(*a)) && to.py_eq(&PyValue::str(*b)));
        let Some((_, _, base)) = route else {
            return Err(PyErr::value_error(
                "No available route for the given airports.",
            ));
        };
        let factor = match class.as_str() {
            Some("economy") => 1.0,
            Some("business") => 2.0,
            Some("first") => 5.0,
            _ => {
                return Err(PyErr::value_error(
                    "Invalid travel class. Options are: economy, business, first.",
                ))
            }
        };
        let digit_sum: u32 = py_iter(date)?
            .iter()
            .filter_map(|c| c.as_str().and_then(|s| s.chars().next()))
            .filter_map(|c| c.to_digit(10))
            .sum();
        let factor = if digit_sum.is_multiple_of(2) {
            factor * 2.0
        } else {
            factor
        };
        if self.long_context {
            return Ok(ALL_ROUTE_COSTS.iter().map(|c| c * factor).collect());
        }
        Ok(vec![base * factor])
    }

    fn card_balance(&self, card: &PyValue) -> Result<PyValue, PyErr> {
        let entry = self
            .credit_card_list
            .get(card)
            .ok_or_else(|| PyErr::key_error(card))?;
        field(entry, "balance").cloned()
    }

    fn set_card_balance(&mut self, card: &PyValue, balance: PyValue) {
        if let Some(PyValue::Dict(d)) = self.credit_card_list.get_mut(card) {
            d.insert(PyValue::str("balance"), balance);
        }
    }

    fn book_flight(&mut self, a: &[PyValue]) -> Result<PyValue, PyErr> {
        let (token, card, date, from, to, class) = (&a[0], &a[1], &a[2], &a[3], &a[4], &a[5]);
        let fail = |msg: String| {
            Ok(PyValue::dict([
                ("booking_status", PyValue::Bool(false)),
                ("error", PyValue::Str(msg)),
            ]))
        };
        if !self.token_ok(token) {
            return fail("Invalid access token".into());
        }
        if !self.credit_card_list.contains_key(card) {
            return fail("Card not registered".into());
        }
        let known = |code: &PyValue| AIRPORTS.iter().any(|a| code.py_eq(&PyValue::str(*a)));
        if !known(from) {
            return fail(format!(
                "Invalid departure airport code: {}",
                from.to_py_str()
            ));
        }
        if !known(to) {
            return fail(format!(
                "Invalid destination airport code: {}",
                to.to_py_str()
            ));
        }
        match strptime_ymd(date) {
            Ok(_) => {}
            Err(e) if e.kind == crate::bfcl::exception::ExcKind::ValueError => {
                return fail("Invalid date format. Use YYYY-MM-DD.".into());
            }
            Err(e) => return Err(e),
        }
        if !matches!(class.as_str(), Some("economy" | "business" | "first")) {
            return fail(
                "Invalid travel class. Must be one of {'first', 'business', 'economy'}".into(),
            );
        }
        let long_context = std::mem::replace(&mut self.long_context, false);
        let cost = self.flight_cost(from, to, date, class);
        self.long_context = long_context;
        let cost = match cost {
            Ok(c) => PyValue::Float(c.first().copied().unwrap_or(0.0)),
            Err(e) if e.kind == crate::bfcl::exception::ExcKind::ValueError => {
                return fail(e.message);
            }
            Err(e) => return Err(e),
        };
        let balance = self.card_balance(card)?;
        if compare(CmpOp::Lt, &balance, &cost)? {
            return fail("Insufficient funds".into());
        }
        if !matches!(self.budget_limit, PyValue::None)
            && compare(CmpOp::Lt, &balance, &self.budget_limit)?
        {
            return fail("Balance is less than budget limit".into());
        }
        let booking_id = self.id(1_000_000, 9_999_999);
        let transaction_id = self.id(10_000_000, 99_999_999);
        self.booking_record.insert(
            booking_id.clone(),
            PyValue::dict([
                ("card_id", card.clone()),
                ("travel_date", date.clone()),
                ("travel_from", from.clone()),
                ("travel_to", to.clone()),
                ("travel_class", class.clone()),
                ("travel_cost", cost.clone()),
                ("transaction_id", transaction_id.clone()),
            ]),
        );
        let balance = arith(ArithOp::Sub, &balance, &cost)?;
        self.set_card_balance(card, balance);
        let history = if self.long_context {
            self.booking_record.clone()
        } else {
            PyDict::new()
        };
        Ok(PyValue::dict([
            ("booking_id", booking_id),
            ("transaction_id", transaction_id),
            ("booking_status", PyValue::Bool(true)),
            ("booking_history", PyValue::Dict(history)),
        ]))
    }

    fn purchase_insurance(&mut self, a: &[PyValue]) -> Result<PyValue, PyErr> {
        let (token, _kind, cost, booking, card) = (&a[0], &a[1], &a[2], &a[3], &a[4]);
        let fail = |msg: &str| {
            Ok(PyValue::dict([
                ("insurance_status", PyValue::Bool(false)),
                ("error", PyValue::str(msg)),
            ]))
        };
        if !self.token_ok(token) {
            return fail("Invalid access token");
        }
        if !matches!(self.budget_limit, PyValue::None)
            && compare(CmpOp::Lt, &self.budget_limit, cost)?
        {
            return fail("Exceeded budget limit");
        }
        if !self.booking_record.contains_key(booking) {
            return fail("Booking not found");
        }
        if !self.credit_card_list.contains_key(card) {
            return fail("Credit card not registered");
        }
        let balance = self.card_balance(card)?;
        if compare(CmpOp::Lt, &balance, cost)? {
            return fail("Insufficient funds");
        }
        let balance = arith(ArithOp::Sub, &balance, cost)?;
        self.set_card_balance(card, balance);
        let insurance_id = self.id(100_000_000, 999_999_999);
        Ok(PyValue::dict([
            ("insurance_id", insurance_id),
            ("insurance_status", PyValue::Bool(true)),
        ]))
    }

    fn verify_traveler(&self, a: &[PyValue]) -> Result<PyValue, PyErr> {
        let (first, last, dob, passport) = (&a[0], &a[1], &a[2], &a[3]);
        let fail = |msg: String| {
            Ok(PyValue::dict([
                ("verification_status", PyValue::Bool(false)),
                ("verification_failure", PyValue::Str(msg)),
            ]))
        };
        if !(self.user_first_name.py_eq(first) && self.user_last_name.py_eq(last)) {
            return fail(format!(
                "Cannot book flight information for another user.Expected {} {}, got {} {}",
                self.user_first_name.to_py_str(),
                self.user_last_name.to_py_str(),
                first.to_py_str(),
                last.to_py_str()
            ));
        }
        let (y, m, d) = match strptime_ymd(dob) {
            Ok(ymd) => ymd,
            Err(e) if e.kind == crate::bfcl::exception::ExcKind::ValueError => {
                return fail("Invalid date of birth format. Please use YYYY-MM-DD.".into());
            }
            Err(e) => return Err(e),
        };
        let age = TODAY.0 - y - i64::from((TODAY.1, TODAY.2) < (m, d));
        if age < 18 {
            return fail("Traveler must be at least 18 years old.".into());
        }
        let us = match passport {
            PyValue::Str(s) => s.starts_with("US"),
            other => return Err(PyErr::no_attribute(other, "startswith")),
        };
        if !us {
            return fail("Passport must be issued by the United States.".into());
        }
        Ok(PyValue::dict([(
            "verification_status",
            PyValue::Bool(true),
        )]))
    }

    fn exchange(
        &self,
        base: &PyValue,
        target: &PyValue,
        value: &PyValue,
    ) -> Result<PyValue, PyErr> {
        for (b, t, rate) in exchange_rates() {
            let (b, t) = (PyValue::str(b), PyValue::str(t));
            if base.py_eq(&b) && target.py_eq(&t) {
                return Ok(PyValue::dict([(
                    "exchanged_value",
                    arith(ArithOp::Mul, value, &rate)?,
                )]));
            }
            if base.py_eq(&t) && target.py_eq(&b) {
                let q = arith(ArithOp::Div, value, &rate)?;
                return Ok(PyValue::dict([(
                    "exchanged_value",
                    PyValue::Float(round2(py_float(&q)?)),
                )]));
            }
        }
        Err(PyErr::value_error(
            "No available exchange rate for the given currencies.",
        ))
    }

    fn dispatch(&mut self, method: &str, a: &[Option<PyValue>]) -> Result<PyValue, PyErr> {
        let arg = |i: usize| a.get(i).cloned().flatten().unwrap_or(PyValue::None);
        let args = |n: usize| -> Vec<PyValue> { (0..n).map(arg).collect() };
        let one = |k: &str, v: PyValue| Ok(PyValue::dict([(k, v)]));
        let invalid_token = || Ok(error_dict("Invalid access token"));
        match method {
            "authenticate_travel" => {
                let token = self.id(100_000, 999_999);
                self.access_token = token.clone();
                self.token_type = PyValue::str("Bearer");
                self.token_expires_in = PyValue::Int(2);
                self.token_scope = arg(3);
                self.user_first_name = arg(4);
                self.user_last_name = arg(5);
                Ok(PyValue::dict([
                    ("expires_in", PyValue::Int(2)),
                    ("access_token", token),
                    ("token_type", PyValue::str("Bearer")),
                    ("scope", arg(3)),
                ]))
            }
            "travel_get_login_status" => one(
                "status",
                PyValue::Bool(!matches!(self.access_token, PyValue::None)),
            ),
            "get_budget_fiscal_year" => one("budget_fiscal_year", PyValue::str("2018")),
            "register_credit_card" => {
                if !self.token_ok(&arg(0)) {
                    return invalid_token();
                }
                let number = arg(1);
                let known = self
                    .credit_card_list
                    .values()
                    .any(|c| field(c, "card_number").is_ok_and(|n| n.py_eq(&number)));
                if known {
                    return Ok(error_dict("Card already registered"));
                }
                let card_id = self.id(100_000_000_000, 999_999_999_999);
                let balance = PyValue::Int(self.random.randint(10_000, 99_999));
                self.credit_card_list.insert(
                    card_id.clone(),
                    PyValue::dict([
                        ("card_number", number),
                        ("expiration_date", arg(2)),
                        ("cardholder_name", arg(3)),
                        ("card_verification_number", arg(4)),
                        ("balance", balance),
                    ]),
                );
                one("card_id", card_id)
            }
            "get_flight_cost" => {
                let costs = self.flight_cost(&arg(0), &arg(1), &arg(2), &arg(3))?;
                one(
                    "travel_cost_list",
                    PyValue::List(costs.into_iter().map(PyValue::Float).collect()),
                )
            }
            "get_credit_card_balance" => {
                if !self.token_ok(&arg(0)) {
                    return invalid_token();
                }
                let card = arg(1);
                if !self.credit_card_list.contains_key(&card) {
                    let ids = PyValue::List(self.credit_card_list.keys().cloned().collect());
                    return Ok(error_dict(format!(
                        "Card not registered. Here are the registered cards: {}",
                        ids.repr()
                    )));
                }
                one("card_balance", self.card_balance(&card)?)
            }
            "book_flight" => self.book_flight(&args(6)),
            "retrieve_invoice" => {
                if !self.token_ok(&arg(0)) {
                    return invalid_token();
                }
                let booking_id = arg(1);
                let Some(record) = self.booking_record.get(&booking_id) else {
                    return Ok(error_dict("Booking not found"));
                };
                let mut invoice = PyDict::new();
                invoice.insert(PyValue::str("booking_id"), booking_id.clone());
                for k in [
                    "travel_date",
                    "travel_from",
                    "travel_to",
                    "travel_class",
                    "travel_cost",
                    "transaction_id",
                ] {
                    invoice.insert(PyValue::str(k), field(record, k)?.clone());
                }
                one("invoice", PyValue::Dict(invoice))
            }
            "list_all_airports" => Ok(PyValue::List(
                AIRPORTS.iter().map(|a| PyValue::str(*a)).collect(),
            )),
            "cancel_booking" => {
                let fail = |msg: &str| {
                    Ok(PyValue::dict([
                        ("cancel_status", PyValue::Bool(false)),
                        ("error", PyValue::str(msg)),
                    ]))
                };
                if !self.token_ok(&arg(0)) {
                    return fail("Invalid access token");
                }
                let booking_id = arg(1);
                let Some(record) = self.booking_record.get(&booking_id).cloned() else {
                    return fail("Booking not found");
                };
                let card = field(&record, "card_id")?.clone();
                let cost = field(&record, "travel_cost")?.clone();
                let balance = arith(ArithOp::Add, &self.card_balance(&card)?, &cost)?;
                self.set_card_balance(&card, balance);
                self.booking_record.remove(&booking_id);
                one("cancel_status", PyValue::Bool(true))
            }
            "compute_exchange_rate" => self.exchange(&arg(0), &arg(1), &arg(2)),
            "verify_traveler_information" => self.verify_traveler(&args(4)),
            "set_budget_limit" => {
                if !self.token_ok(&arg(0)) {
                    return invalid_token();
                }
                self.budget_limit = PyValue::Float(py_float(&arg(1))?);
                one("budget_limit", self.budget_limit.clone())
            }
            "get_nearest_airport_by_city" => {
                let city = arg(0);
                let airport = CITY_AIRPORTS
                    .iter()
                    .find(|(c, _)| city.py_eq(&PyValue::str(*c)))
                    .map_or("Unknown", |(_, a)| a);
                one("nearest_airport", PyValue::str(airport))
            }
            "purchase_insurance" => self.purchase_insurance(&args(5)),
            "contact_customer_support" => {
                if !self.booking_record.contains_key(&arg(0)) {
                    return Ok(error_dict("Booking not found"));
                }
                one(
                    "customer_support_message",
                    PyValue::str(
                        "Thank you for contacting customer support. Your message has been received and we will get back to you shortly.",
                    ),
                )
            }
            "get_all_credit_cards" => one(
                "credit_card_list",
                PyValue::Dict(self.credit_card_list.clone()),
            ),
            "get_booking_history" => {
                if !self.token_ok(&arg(0)) {
                    return invalid_token();
                }
                one(
                    "booking_history",
                    PyValue::Dict(self.booking_record.clone()),
                )
            }
            _ => Err(PyErr::no_attribute(&PyValue::None, method)),
        }
    }
}

fn params(method: &str) -> &'static [Param] {
    const AUTH: [Param; 6] = [
        req("client_id"),
        req("client_secret"),
        req("refresh_token"),
        req("grant_type"),
        req("user_first_name"),
        req("user_last_name"),
    ];
    const BOOK: [Param; 6] = [
        req("access_token"),
        req("card_id"),
        req("travel_date"),
        req("travel_from"),
        req("travel_to"),
        req("travel_class"),
    ];
    const CANCEL: [Param; 2] = [req("access_token"), req("booking_id")];
    const EXCHANGE: [Param; 3] = [req("base_currency"), req("target_currency"), req("value")];
    const SUPPORT: [Param; 2] = [req("booking_id"), req("message")];
    const FISCAL: [Param; 2] = [opt("lastModifiedAfter"), opt("includeRemoved")];
    const BALANCE: [Param; 2] = [req("access_token"), req("card_id")];
    const COST: [Param; 4] = [
        req("travel_from"),
        req("travel_to"),
        req("travel_date"),
        req("travel_class"),
    ];
    const INSURANCE: [Param; 5] = [
        req("access_token"),
        req("insurance_type"),
        req("insurance_cost"),
        req("booking_id"),
        req("card_id"),
    ];
    const REGISTER: [Param; 5] = [
        req("access_token"),
        req("card_number"),
        req("expiration_date"),
        req("cardholder_name"),
        req("card_verification_number"),
    ];
    const INVOICE: [Param; 3] = [req("access_token"), opt("booking_id"), opt("insurance_id")];
    const BUDGET: [Param; 2] = [req("access_token"), req("budget_limit")];
    const VERIFY: [Param; 4] = [
        req("first_name"),
        req("last_name"),
        req("date_of_birth"),
        req("passport_number"),
    ];
    match method {
        "authenticate_travel" => &AUTH,
        "book_flight" => &BOOK,
        "cancel_booking" => &CANCEL,
        "compute_exchange_rate" => &EXCHANGE,
        "contact_customer_support" => &SUPPORT,
        "get_booking_history" => {
            const P: &[Param] = &[req("access_token")];
            P
        }
        "get_budget_fiscal_year" => &FISCAL,
        "get_credit_card_balance" => &BALANCE,
        "get_flight_cost" => &COST,
        "get_nearest_airport_by_city" => {
            const P: &[Param] = &[req("location")];
            P
        }
        "purchase_insurance" => &INSURANCE,
        "register_credit_card" => &REGISTER,
        "retrieve_invoice" => &INVOICE,
        "set_budget_limit" => &BUDGET,
        "verify_traveler_information" => &VERIFY,
        _ => &[],
    }
}

impl PythonClass for TravelApi {
    const CLASS: &'static str = CLASS;
    const METHODS: &'static [&'static str] = METHODS;

    fn params(method: &str) -> &'static [Param] {
        params(method)
    }

    fn call_bound(&mut self, method: &str, bound: Bound) -> Result<PyValue, PyErr> {
        self.dispatch(method, &bound.into_values())
    }

    fn vars(&self) -> Map<String, Value> {
        let cards = PyValue::Dict(self.credit_card_list.clone());
        let bookings = PyValue::Dict(self.booking_record.clone());
        let long_context = PyValue::Bool(self.long_context);
        snapshot_of(&[
            ("credit_card_list", &cards),
            ("booking_record", &bookings),
            ("access_token", &self.access_token),
            ("token_type", &self.token_type),
            ("token_expires_in", &self.token_expires_in),
            ("token_scope", &self.token_scope),
            ("user_first_name", &self.user_first_name),
            ("user_last_name", &self.user_last_name),
            ("budget_limit", &self.budget_limit),
            ("long_context", &long_context),
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_ids_follow_cpython() {
        let mut api = TravelApi::load(&PyDict::new(), false);
        assert_eq!(api.id(100_000, 999_999).repr(), "'251675'");
        assert_eq!(round2(50000.0 / 7.0), 7142.86);
    }
}
