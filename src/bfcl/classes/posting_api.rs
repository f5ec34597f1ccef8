//! `TwitterAPI`: a posting service (tweets, comments, retweets, follows) with a login.
//!
//! Observed reference behaviour (BFCL trace README, "TwitterAPI", and the traces): scenario
//! tweet keys become ints while scenario comment keys stay strings, and `comment` stores
//! under the int tweet id (so `"0"` and `0` can coexist); lookups use Python dict membership
//! (`'10'` is not tweet `10`); posting, retweeting, commenting, following and listing need
//! authentication and check it before the tweet id; `mention` extends the tweet's mention
//! list with any iterable (a string adds its characters); `get_user_stats` counts follows
//! only for the own username.

use serde_json::{Map, Value};

use super::{cfg, error_dict, snapshot_of, PythonClass};
use crate::bfcl::exception::PyErr;
use crate::bfcl::ops::{py_iter, str_contains};
use crate::bfcl::signature::{opt, req, Bound, Param};
use crate::bfcl::value::{PyDict, PyValue};
use crate::bfcl::BfclError;

const CLASS: &str = "TwitterAPI";
const METHODS: &[&str] = &[
    "authenticate_twitter",
    "comment",
    "follow_user",
    "get_tweet",
    "get_tweet_comments",
    "get_user_stats",
    "get_user_tweets",
    "list_all_following",
    "mention",
    "post_tweet",
    "posting_get_login_status",
    "retweet",
    "search_tweets",
    "unfollow_user",
];

/// The posting service's compared state.
#[derive(Debug, Clone)]
pub struct TwitterApi {
    username: PyValue,
    password: PyValue,
    authenticated: PyValue,
    tweets: PyDict,
    comments: PyDict,
    retweets: PyDict,
    following_list: PyValue,
    tweet_counter: PyValue,
}

/// Raises `TypeError: unhashable type` for keys a Python dict cannot hold.
fn hashable(key: &PyValue) -> Result<(), PyErr> {
    match key {
        PyValue::List(_) | PyValue::Dict(_) | PyValue::Set(_) => Err(PyErr::type_error(format!(
            "unhashable type: '{}'",
            key.type_name()
        ))),
        _ => Ok(()),
    }
}

fn dict_of(v: PyValue) -> PyDict {
    match v {
        PyValue::Dict(d) => d,
        _ => PyDict::new(),
    }
}

impl TwitterApi {
    /// Loads the scenario (user `john`, following `alice` and `bob` by default); tweet keys
    /// become ints as `int(key)` does.
    ///
    /// # Errors
    /// [`BfclError::Config`] for a tweet key that is not an integer.
    pub fn load(config: &PyDict) -> Result<Self, BfclError> {
        let mut tweets = PyDict::new();
        for (k, v) in dict_of(cfg(config, "tweets", PyValue::Dict(PyDict::new()))).iter() {
            let key = match k {
                PyValue::Str(s) => s.trim().parse::<i64>().map_err(|_| BfclError::Config {
                    class: CLASS.into(),
                    reason: format!("tweet key {} is not an integer", k.repr()),
                })?,
                PyValue::Int(i) => *i,
                other => {
                    return Err(BfclError::Config {
                        class: CLASS.into(),
                        reason: format!("tweet key {} is not an integer", other.repr()),
                    })
                }
            };
            tweets.insert(PyValue::Int(key), v.clone());
        }
        Ok(Self {
            username: cfg(config, "username", PyValue::str("john")),
            password: cfg(config, "password", PyValue::str("john123")),
            authenticated: cfg(config, "authenticated", PyValue::Bool(false)),
            tweets,
            comments: dict_of(cfg(config, "comments", PyValue::Dict(PyDict::new()))),
            retweets: dict_of(cfg(config, "retweets", PyValue::Dict(PyDict::new()))),
            following_list: cfg(
                config,
                "following_list",
                PyValue::List(vec![PyValue::str("alice"), PyValue::str("bob")]),
            ),
            tweet_counter: cfg(config, "tweet_counter", PyValue::Int(0)),
        })
    }

    fn not_found(id: &PyValue) -> PyValue {
        error_dict(format!("Tweet with ID {} not found.", id.to_py_str()))
    }

    fn unauthenticated(action: &str) -> PyValue {
        error_dict(format!(
            "User not authenticated. Please authenticate before {action}."
        ))
    }

    fn field<'a>(tweet: &'a PyValue, key: &str) -> Result<&'a PyValue, PyErr> {
        match tweet {
            PyValue::Dict(d) => d
                .get_str(key)
                .ok_or_else(|| PyErr::key_error(&PyValue::str(key))),
            other => Err(PyErr::type_error(format!(
                "'{}' object is not subscriptable",
                other.type_name()
            ))),
        }
    }

    fn dispatch(&mut self, method: &str, a: &[Option<PyValue>]) -> Result<PyValue, PyErr> {
        let arg = |i: usize| a.get(i).cloned().flatten().unwrap_or(PyValue::None);
        let authed = self.authenticated.truthy();
        match method {
            "authenticate_twitter" => {
                let ok = arg(0).py_eq(&self.username) && arg(1).py_eq(&self.password);
                if ok {
                    self.authenticated = PyValue::Bool(true);
                }
                Ok(PyValue::dict([(
                    "authentication_status",
                    PyValue::Bool(ok),
                )]))
            }
            "posting_get_login_status" => {
                Ok(PyValue::dict([("login_status", PyValue::Bool(authed))]))
            }
            "follow_user" | "unfollow_user" => {
                let follow = method == "follow_user";
                if !authed {
                    return Ok(Self::unauthenticated(if follow {
                        "following"
                    } else {
                        "unfollowing"
                    }));
                }
                let user = arg(0);
                let PyValue::List(list) = &mut self.following_list else {
                    return Err(PyErr::no_attribute(&self.following_list, "append"));
                };
                let pos = list.iter().position(|u| u.py_eq(&user));
                let key = if follow {
                    "follow_status"
                } else {
                    "unfollow_status"
                };
                let changed = match (follow, pos) {
                    (true, None) => {
                        list.push(user);
                        true
                    }
                    (false, Some(i)) => {
                        list.remove(i);
                        true
                    }
                    _ => false,
                };
                Ok(PyValue::dict([(key, PyValue::Bool(changed))]))
            }
            "list_all_following" => {
                if !authed {
                    return Ok(Self::unauthenticated("listing following"));
                }
                Ok(PyValue::dict([(
                    "following_list",
                    self.following_list.clone(),
                )]))
            }
            "post_tweet" => {
                if !authed {
                    return Ok(Self::unauthenticated("posting"));
                }
                let tweet = PyValue::dict([
                    ("id", self.tweet_counter.clone()),
                    ("username", self.username.clone()),
                    ("content", arg(0)),
                    ("tags", a[1].clone().unwrap_or(PyValue::List(vec![]))),
                    ("mentions", a[2].clone().unwrap_or(PyValue::List(vec![]))),
                ]);
                hashable(&self.tweet_counter)?;
                self.tweets
                    .insert(self.tweet_counter.clone(), tweet.clone());
                self.tweet_counter = match &self.tweet_counter {
                    PyValue::Int(i) => PyValue::Int(i + 1),
                    other => crate::bfcl::ops::arith(
                        crate::bfcl::ops::ArithOp::Add,
                        other,
                        &PyValue::Int(1),
                    )?,
                };
                Ok(tweet)
            }
            "retweet" => {
                if !authed {
                    return Ok(Self::unauthenticated("retweeting"));
                }
                let id = arg(0);
                hashable(&id)?;
                if !self.tweets.contains_key(&id) {
                    return Ok(Self::not_found(&id));
                }
                hashable(&self.username)?;
                if self
                    .retweets
                    .get(&self.username)
                    .is_some_and(|l| py_iter(l).is_ok_and(|l| l.iter().any(|x| x.py_eq(&id))))
                {
                    return Ok(PyValue::dict([(
                        "retweet_status",
                        PyValue::str("Already retweeted"),
                    )]));
                }
                match self.retweets.get_mut(&self.username) {
                    Some(PyValue::List(l)) => l.push(id),
                    Some(other) => return Err(PyErr::no_attribute(other, "append")),
                    None => self
                        .retweets
                        .insert(self.username.clone(), PyValue::List(vec![id])),
                }
                Ok(PyValue::dict([(
                    "retweet_status",
                    PyValue::str("Successfully retweeted"),
                )]))
            }
            "comment" => {
                if !authed {
                    return Ok(Self::unauthenticated("commenting"));
                }
                let id = arg(0);
                hashable(&id)?;
                if !self.tweets.contains_key(&id) {
                    return Ok(Self::not_found(&id));
                }
                let entry =
                    PyValue::dict([("username", self.username.clone()), ("content", arg(1))]);
                match self.comments.get_mut(&id) {
                    Some(PyValue::List(l)) => l.push(entry),
                    Some(other) => return Err(PyErr::no_attribute(other, "append")),
                    None => self.comments.insert(id, PyValue::List(vec![entry])),
                }
                Ok(PyValue::dict([(
                    "comment_status",
                    PyValue::str("Comment added successfully"),
                )]))
            }
            "mention" => {
                let id = arg(0);
                hashable(&id)?;
                let Some(tweet) = self.tweets.get_mut(&id) else {
                    return Ok(Self::not_found(&id));
                };
                let added = py_iter(&arg(1))?;
                match tweet {
                    PyValue::Dict(d) => match d.get_mut(&PyValue::str("mentions")) {
                        Some(PyValue::List(l)) => l.extend(added),
                        Some(other) => return Err(PyErr::no_attribute(other, "extend")),
                        None => return Err(PyErr::key_error(&PyValue::str("mentions"))),
                    },
                    other => {
                        return Err(PyErr::type_error(format!(
                            "'{}' object is not subscriptable",
                            other.type_name()
                        )))
                    }
                }
                Ok(PyValue::dict([(
                    "mention_status",
                    PyValue::str("Users mentioned successfully"),
                )]))
            }
            "get_tweet" => {
                let id = arg(0);
                hashable(&id)?;
                Ok(match self.tweets.get(&id) {
                    Some(t) => t.clone(),
                    None => Self::not_found(&id),
                })
            }
            "get_tweet_comments" => {
                let id = arg(0);
                hashable(&id)?;
                if !self.tweets.contains_key(&id) {
                    return Ok(Self::not_found(&id));
                }
                Ok(self
                    .comments
                    .get(&id)
                    .cloned()
                    .unwrap_or(PyValue::List(vec![])))
            }
            "get_user_tweets" => {
                let user = arg(0);
                let mut out = Vec::new();
                for t in self.tweets.values() {
                    if Self::field(t, "username")?.py_eq(&user) {
                        out.push(t.clone());
                    }
                }
                Ok(PyValue::List(out))
            }
            "search_tweets" => {
                let keyword = arg(0);
                let mut out = Vec::new();
                for t in self.tweets.values() {
                    let content = Self::field(t, "content")?;
                    let in_content = match content {
                        PyValue::Str(s) => str_contains(s, &keyword)?,
                        other => py_iter(other)
                            .map_err(|_| {
                                PyErr::type_error(format!(
                                    "argument of type '{}' is not iterable",
                                    other.type_name()
                                ))
                            })?
                            .iter()
                            .any(|x| x.py_eq(&keyword)),
                    };
                    let hit = in_content || {
                        let tags = Self::field(t, "tags")?;
                        match tags {
                            PyValue::Str(s) => str_contains(s, &keyword)?,
                            other => py_iter(other)
                                .map_err(|_| {
                                    PyErr::type_error(format!(
                                        "argument of type '{}' is not iterable",
                                        other.type_name()
                                    ))
                                })?
                                .iter()
                                .any(|x| x.py_eq(&keyword)),
                        }
                    };
                    if hit {
                        out.push(t.clone());
                    }
                }
                Ok(PyValue::List(out))
            }
            "get_user_stats" => {
                let user = arg(0);
                let mut tweet_count = 0i64;
                for t in self.tweets.values() {
                    if Self::field(t, "username")?.py_eq(&user) {
                        tweet_count += 1;
                    }
                }
                let following_count = if user.py_eq(&self.username) {
                    py_iter(&self.following_list)?.len() as i64
                } else {
                    0
                };
                hashable(&user)?;
                let retweet_count = match self.retweets.get(&user) {
                    Some(l) => py_iter(l)?.len() as i64,
                    None => 0,
                };
                Ok(PyValue::dict([
                    ("tweet_count", PyValue::Int(tweet_count)),
                    ("following_count", PyValue::Int(following_count)),
                    ("retweet_count", PyValue::Int(retweet_count)),
                ]))
            }
            _ => Err(PyErr::no_attribute(&PyValue::None, method)),
        }
    }
}

fn params(method: &str) -> &'static [Param] {
    const AUTH: [Param; 2] = [req("username"), req("password")];
    const COMMENT: [Param; 2] = [req("tweet_id"), req("comment_content")];
    const MENTION: [Param; 2] = [req("tweet_id"), req("mentioned_usernames")];
    const POST: [Param; 3] = [req("content"), opt("tags"), opt("mentions")];
    const ID: [Param; 1] = [req("tweet_id")];
    const USER: [Param; 1] = [req("username")];
    const FOLLOW: [Param; 1] = [req("username_to_follow")];
    const UNFOLLOW: [Param; 1] = [req("username_to_unfollow")];
    const KEYWORD: [Param; 1] = [req("keyword")];
    match method {
        "authenticate_twitter" => &AUTH,
        "comment" => &COMMENT,
        "mention" => &MENTION,
        "post_tweet" => &POST,
        "get_tweet" | "get_tweet_comments" | "retweet" => &ID,
        "get_user_stats" | "get_user_tweets" => &USER,
        "follow_user" => &FOLLOW,
        "unfollow_user" => &UNFOLLOW,
        "search_tweets" => &KEYWORD,
        _ => &[],
    }
}

impl PythonClass for TwitterApi {
    const CLASS: &'static str = CLASS;
    const METHODS: &'static [&'static str] = METHODS;

    fn params(method: &str) -> &'static [Param] {
        params(method)
    }

    fn call_bound(&mut self, method: &str, bound: Bound) -> Result<PyValue, PyErr> {
        self.dispatch(method, &bound.into_values())
    }

    fn vars(&self) -> Map<String, Value> {
        let tweets = PyValue::Dict(self.tweets.clone());
        let comments = PyValue::Dict(self.comments.clone());
        let retweets = PyValue::Dict(self.retweets.clone());
        snapshot_of(&[
            ("username", &self.username),
            ("password", &self.password),
            ("authenticated", &self.authenticated),
            ("tweets", &tweets),
            ("comments", &comments),
            ("retweets", &retweets),
            ("following_list", &self.following_list),
            ("tweet_counter", &self.tweet_counter),
        ])
    }
}
