//! Answers computed from the store (a resolve, a policy-filtered list), and what they are
//! derived from (a resolve's ranking, a list's ids, a count), kept while the store's answer
//! generation stays the same: every transaction that stores a kernel or a verification moves
//! it (a trigger of migration 0008), on every replica, so a kept answer is the one the store
//! would give now. A hit costs one indexed read of the generation.
//!
//! A plain map behind a mutex: entries of an older generation are never served, and the map is
//! emptied when it reaches its bound (a least-recently-used order would buy little here: the
//! whole map goes stale at the next write anyway).

use axum::http::header;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use std::collections::HashMap;
use std::sync::Mutex;

/// The most answers kept at once (per cache, unless it is made with another bound).
pub const MAX_ANSWERS: usize = 4096;

/// The most resolve pools, resolve rankings and policy lists' ids kept at once (each cache):
/// each grows with its group, so fewer of them are kept than answers. A pool holds per kernel
/// of its group a label, a verdict, shared pointers to the index's coverage and timed cases,
/// and an excluded line (~0.5 KB), plus its speed orders; a ranking a flag per pool entry, up
/// to 100 excluded lines and up to 8 answer texts (~20 KB each); a list 8 bytes per kernel.
/// Estimated, not measured: at 10,000 kernels (groups of up to 1,250) up to ~160 MB of pools
/// and ~45 MB of rankings if every kept one were of a largest group. Measured (bench/LOAD.md):
/// the server's resident set went from 124 to 208 MB under a new policy per request over five
/// groups, the answer cache's 4,096 texts included.
pub const MAX_KEPT_LISTS: usize = 256;

/// Values computed from the store, each kept with the generation it was computed at.
pub struct GenerationCache<T> {
    answers: Mutex<HashMap<String, (i64, T)>>,
    /// The most values kept at once.
    max: usize,
}

impl<T> Default for GenerationCache<T> {
    fn default() -> Self {
        GenerationCache::bounded(MAX_ANSWERS)
    }
}

impl<T> GenerationCache<T> {
    /// A cache of at most `max` values (for large ones: a resolve's ranking, a list's ids).
    pub fn bounded(max: usize) -> Self {
        GenerationCache {
            answers: Mutex::new(HashMap::new()),
            max: max.max(1),
        }
    }
}

impl<T: Clone> GenerationCache<T> {
    /// The value kept for `key` at `generation`, if any.
    pub fn get(&self, key: &str, generation: i64) -> Option<T> {
        let answers = self.answers.lock().expect("answer cache lock");
        answers
            .get(key)
            .filter(|(g, _)| *g == generation)
            .map(|(_, a)| a.clone())
    }

    pub fn insert(&self, key: String, generation: i64, value: T) {
        let mut answers = self.answers.lock().expect("answer cache lock");
        if answers.len() >= self.max && !answers.contains_key(&key) {
            answers.clear();
        }
        answers.insert(key, (generation, value));
    }
}

/// API answers as JSON text.
pub type AnswerCache = GenerationCache<Bytes>;

impl AnswerCache {
    /// `route` with its query parameters in a fixed order: the key of an answer.
    pub fn key(route: &str, q: &HashMap<String, String>) -> String {
        let mut params: Vec<(&String, &String)> = q.iter().collect();
        params.sort();
        let mut key = String::from(route);
        for (k, v) in params {
            key.push('\n');
            key.push_str(k);
            key.push('=');
            key.push_str(v);
        }
        key
    }

    /// Keep `answer` (as JSON text) for `key` at `generation`; the response to send.
    pub fn put(&self, key: String, generation: i64, answer: &serde_json::Value) -> Response {
        let text = Bytes::from(serde_json::to_vec(answer).expect("answer serialises"));
        self.insert(key, generation, text.clone());
        json_response(text)
    }
}

/// A kept answer as a 200 JSON response.
pub fn json_response(text: Bytes) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], text).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_an_answer_for_its_generation_only() {
        let c = AnswerCache::default();
        let q: HashMap<String, String> =
            [("b".into(), "2".into()), ("a".into(), "1".into())].into();
        let key = AnswerCache::key("/v1/resolve", &q);
        assert_eq!(key, "/v1/resolve\na=1\nb=2");
        c.put(key.clone(), 7, &serde_json::json!({"x": 1}));
        assert_eq!(c.get(&key, 7).unwrap().as_ref(), br#"{"x":1}"#);
        assert!(c.get(&key, 8).is_none(), "a newer generation misses");
        for i in 0..MAX_ANSWERS {
            c.put(format!("k{i}"), 8, &serde_json::json!(i));
        }
        assert!(c.answers.lock().unwrap().len() <= MAX_ANSWERS);
    }
}
