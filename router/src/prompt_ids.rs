//! Token ids of chat prompts the router has seen, so that a chat continuing an earlier one (an agent's
//! next turn: the same messages and more) is routed by precise_prefix without asking an engine to
//! tokenize it first (docs/kv-events.md, "Where token ids come from").
//!
//! A request's keys are rolling hashes of its template fields (model, tools, ...) and each prefix of
//! its messages. The ids of a prompt are stored under the key of all its messages, from the engine's
//! /tokenize answer or from the `prompt_token_ids` of its stream (a continued chat that gets neither
//! is tokenized after it was sent, off its path: `refreshed`). A later request whose messages
//! begin with those takes the stored ids, less the last `MARGIN` tokens (the generation prompt the
//! next request renders as the start of the assistant's turn), as a prefix of its own.
//!
//! That holds only while the chat template renders earlier messages the same whatever follows them.
//! The stream's own `prompt_token_ids` check it: a prompt that does not begin with the stored prefix
//! turns this path off for the life of the process (`kimik3_router_token_ids_total{source=
//! "prefix_mismatch"}`), since a prefix that is not one would count blocks of another prompt as a hit.
//!
//! Memory: ids as u32 (K3's vocabulary is far below 2^32), at most `cap` tokens in all, least
//! recently used first out. Keys are 64-bit FNV-1a: a false match needs a 64-bit collision.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{Map, Value};

use crate::metrics::METRICS;
use crate::policy::fnv;

/// Tokens dropped from the end of a stored prompt: its generation prompt (K3's assistant header, and
/// `<think>` when thinking), which a continuing request renders as the assistant message's start.
pub const MARGIN: usize = 16;

/// The values of `kimik3_router_token_ids_total{source}` (proxy.rs token_ids, and `check` here).
pub const SOURCES: &[&str] = &["body", "continued", "tokenize", "none", "refreshed", "prefix_mismatch"];

/// The request fields a chat template renders besides the messages.
const TEMPLATE_KEYS: &[&str] =
    &["model", "tools", "chat_template_kwargs", "add_generation_prompt", "continue_final_message", "documents"];

pub struct PromptIds {
    cap: usize,
    broken: AtomicBool,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    by_key: HashMap<u64, (Arc<Vec<u32>>, u64)>,
    lru: BTreeMap<u64, u64>,
    tick: u64,
    held: usize,
}

/// A chat request's keys, one per prefix of its messages (index i: messages 0..=i); none for a body
/// without messages.
pub fn keys(body: &Map<String, Value>) -> Vec<u64> {
    let Some(messages) = body.get("messages").and_then(Value::as_array) else {
        return Vec::new();
    };
    let fields: Vec<(&str, &Value)> = TEMPLATE_KEYS.iter().filter_map(|k| body.get(*k).map(|v| (*k, v))).collect();
    let mut key = fnv(serde_json::to_string(&fields).unwrap_or_default().as_bytes());
    messages
        .iter()
        .map(|m| {
            let mut bytes = key.to_le_bytes().to_vec();
            bytes.extend_from_slice(&fnv(serde_json::to_string(m).unwrap_or_default().as_bytes()).to_le_bytes());
            key = fnv(&bytes);
            key
        })
        .collect()
}

impl PromptIds {
    pub fn new(cap: usize) -> Self {
        Self { cap, broken: AtomicBool::new(false), inner: Mutex::new(Inner::default()) }
    }

    /// The ids a request with these keys begins with: the longest stored prompt whose messages its
    /// own begin with, less MARGIN tokens. None when nothing fits, or the path is off.
    pub fn prefix(&self, keys: &[u64]) -> Option<Vec<u64>> {
        if self.broken.load(Ordering::Relaxed) || self.cap == 0 {
            return None;
        }
        let mut inner = self.inner.lock().ok()?;
        let (key, ids) = keys.iter().rev().find_map(|k| inner.by_key.get(k).map(|(ids, _)| (*k, ids.clone())))?;
        inner.touch(key);
        let keep = ids.len().saturating_sub(MARGIN);
        (keep > 0).then(|| ids.iter().take(keep).map(|id| u64::from(*id)).collect())
    }

    /// Keep a request's prompt ids under the key of all its messages.
    pub fn store(&self, keys: &[u64], ids: &[u64]) {
        let (Some(key), false) = (keys.last().copied(), ids.is_empty() || self.cap == 0) else {
            return;
        };
        if ids.len() > self.cap {
            return;
        }
        let Ok(narrow) = ids.iter().map(|id| u32::try_from(*id)).collect::<Result<Vec<u32>, _>>() else {
            return;
        };
        let Ok(mut inner) = self.inner.lock() else {
            return;
        };
        inner.remove(key);
        inner.held += narrow.len();
        inner.tick += 1;
        let tick = inner.tick;
        inner.by_key.insert(key, (Arc::new(narrow), tick));
        inner.lru.insert(tick, key);
        while inner.held > self.cap {
            let Some((_, oldest)) = inner.lru.pop_first() else { break };
            inner.remove(oldest);
        }
    }

    /// A prompt routed with `prefix` turned out to have these ids: does it begin with the prefix?
    /// If not, the chat template is not prefix-stable and this path goes off for good.
    pub fn check(&self, prefix: &[u64], actual: &[u64]) {
        if actual.starts_with(prefix) {
            return;
        }
        if !self.broken.swap(true, Ordering::Relaxed) {
            crate::warn!(
                "a prompt did not begin with the token ids of the chat it continues: the chat template renders \
                 earlier messages differently; precise_prefix asks the engines for token ids from now on"
            );
        }
        METRICS.inc("kimik3_router_token_ids_total", &[("source", "prefix_mismatch")]);
    }
}

impl Inner {
    fn touch(&mut self, key: u64) {
        self.tick += 1;
        let tick = self.tick;
        if let Some((_, at)) = self.by_key.get_mut(&key) {
            self.lru.remove(at);
            *at = tick;
            self.lru.insert(tick, key);
        }
    }

    fn remove(&mut self, key: u64) {
        if let Some((ids, at)) = self.by_key.remove(&key) {
            self.lru.remove(&at);
            self.held -= ids.len();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn body(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn a_continuing_chat_takes_the_earlier_prompts_ids_less_the_margin() {
        let p = PromptIds::new(1000);
        let first = body(json!({"model": "m", "messages": [{"role": "user", "content": "a"}]}));
        let ids: Vec<u64> = (0..40).collect();
        p.store(&keys(&first), &ids);
        let next = body(json!({"model": "m", "messages": [
            {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]}));
        assert_eq!(p.prefix(&keys(&next)), Some((0..40 - MARGIN as u64).collect()));
        // Other tools, another edit of an earlier message, or a new chat: nothing.
        let tools = body(json!({"model": "m", "tools": [{"type": "function"}], "messages": next["messages"]}));
        assert_eq!(p.prefix(&keys(&tools)), None);
        let edited = body(
            json!({"model": "m", "messages": [{"role": "user", "content": "A"}, {"role": "user", "content": "c"}]}),
        );
        assert_eq!(p.prefix(&keys(&edited)), None);
        assert_eq!(p.prefix(&keys(&body(json!({"prompt": "a"})))), None);
    }

    #[test]
    fn the_longest_stored_prefix_wins_and_the_cap_holds() {
        let p = PromptIds::new(100);
        let m = |n: usize| {
            body(
                json!({"messages": (0..n).map(|i| json!({"role": "user", "content": i.to_string()})).collect::<Vec<_>>()}),
            )
        };
        p.store(&keys(&m(1)), &[1; 30]);
        p.store(&keys(&m(2)), &[2; 40]);
        assert_eq!(p.prefix(&keys(&m(3))), Some(vec![2; 40 - MARGIN]));
        p.store(&keys(&m(3)), &[3; 50]); // 120 held > 100: the least recently used (m(1)) goes
        assert_eq!(p.prefix(&keys(&m(1))), None);
        assert_eq!(p.prefix(&keys(&m(4))), Some(vec![3; 50 - MARGIN]));
        p.store(&keys(&m(5)), &[5; 101]); // larger than the whole cap: not kept
        assert_eq!(p.prefix(&keys(&m(6))), Some(vec![3; 50 - MARGIN]));
    }

    #[test]
    fn a_prompt_that_does_not_begin_with_its_prefix_turns_the_path_off() {
        let p = PromptIds::new(1000);
        let first = body(json!({"messages": [{"role": "user", "content": "a"}]}));
        p.store(&keys(&first), &[7; 40]);
        p.check(&[7; 24], &[7; 60]);
        assert!(p.prefix(&keys(&first)).is_some());
        p.check(&[7; 24], &[8; 60]);
        assert_eq!(p.prefix(&keys(&first)), None);
    }
}
