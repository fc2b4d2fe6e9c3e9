//! The inference routes the router serves: one row each. A row says what the prefix key is made of,
//! which fields cap the answer's length, what the prefill leg's body overrides, how a complete
//! stream ends, how its usage is named and what a request may not ask for. Everything route-specific
//! in proxy.rs reads its row; adding a route is adding a row (and its server-side twin in the front's
//! allowlist, operator/kimik3_operator/render/front.py, and the engine simulator).
//!
//! Shapes are vLLM 0.33.0's (docs/router.md, "Routes"): /v1/chat/completions and /v1/completions
//! (entrypoints/openai/chat_completion, completion), /v1/responses (entrypoints/openai/responses:
//! protocol.py takes kv_transfer_params and max_output_tokens, serving.py returns the prefill's
//! kv_transfer_params and forces `store` off unless VLLM_ENABLE_RESPONSES_API_STORE is set, which
//! keeps a response in that one engine's memory).

use crate::reply;
use bytes::Bytes;
use serde_json::{Map, Value};

/// What a route's usage object calls the prompt's and the answer's token counts.
pub struct UsageNames {
    pub input: &'static str,
    pub output: &'static str,
    pub input_details: &'static str,
}

const CHAT_USAGE: UsageNames =
    UsageNames { input: "prompt_tokens", output: "completion_tokens", input_details: "prompt_tokens_details" };

/// What keeps a one-token prefill leg from stopping on EOS: `min_tokens: 1` where the route's
/// request has it, else `ignore_eos: true` (the Responses API has no min_tokens).
pub enum OneToken {
    MinTokens,
    IgnoreEos,
}

impl OneToken {
    pub fn field(&self) -> (&'static str, Value) {
        match self {
            OneToken::MinTokens => ("min_tokens", Value::from(1)),
            OneToken::IgnoreEos => ("ignore_eos", Value::Bool(true)),
        }
    }
}

pub struct Route {
    pub path: &'static str,
    /// The `route` label of the router's metrics.
    pub label: &'static str,
    /// The request fields whose JSON makes the prefix key (cache-aware routing), in this order.
    pub prompt: &'static [&'static str],
    /// The fields that cap the answer's length, in the order the engine reads them (first found
    /// wins: the whole-answer watchdog); the prefill leg sets each one the client gave to 1.
    pub max_tokens: &'static [&'static str],
    /// The cap the prefill leg always gets (1), given or not.
    pub prefill_cap: &'static str,
    /// How the prefill leg is kept from stopping on an end-of-sequence token (vLLM hands KV over
    /// only for a request stopped by its length).
    pub one_token: OneToken,
    /// Fields forced on both legs (None: removed): what the deployment cannot honour.
    pub forced: &'static [(&'static str, Option<bool>)],
    /// A complete SSE stream has a line starting with one of these; one without was cut.
    pub stream_ends: &'static [&'static [u8]],
    pub usage: UsageNames,
    /// The SSE event that ends a cut stream, in the route's own event format.
    pub stream_error: fn(u16, &str, &str) -> Bytes,
    /// A request the deployment refuses, with the client's message.
    pub refuse: fn(&Map<String, Value>) -> Option<&'static str>,
}

fn refuse_nothing(_: &Map<String, Value>) -> Option<&'static str> {
    None
}

/// Stored responses live in one engine's memory (and only with VLLM_ENABLE_RESPONSES_API_STORE,
/// which the operator never sets): a follow-up routed to any engine would not find its parent.
pub const NOT_STORED: &str = "this deployment stores no responses: vLLM keeps them in one engine's memory and requests \
     are routed to any engine; send the earlier turns in `input` instead of `previous_response_id`";

fn refuse_stored(body: &Map<String, Value>) -> Option<&'static str> {
    if body.get("previous_response_id").is_some_and(|v| !v.is_null()) {
        return Some(NOT_STORED);
    }
    // Anything but false or null: vLLM's pydantic model would coerce "true" or 1 to true.
    if body.get("background").is_some_and(|v| !v.is_null() && *v != Value::Bool(false)) {
        return Some(
            "background responses are not supported: they need a response store, which this deployment does not keep",
        );
    }
    None
}

fn responses_error(status: u16, kind: &str, message: &str) -> Bytes {
    let event = serde_json::json!({"type": "error", "code": kind, "message": message, "param": null});
    let _ = status; // the Responses error event carries no status (OpenAI's ResponseErrorEvent)
    Bytes::from(format!("event: error\ndata: {event}\n\n"))
}

pub static ROUTES: [Route; 3] = [
    Route {
        path: "/v1/chat/completions",
        label: "chat_completions",
        prompt: &["messages"],
        // vLLM's chat takes max_completion_tokens over the deprecated max_tokens.
        max_tokens: &["max_completion_tokens", "max_tokens"],
        prefill_cap: "max_tokens",
        one_token: OneToken::MinTokens,
        forced: &[],
        stream_ends: &[b"data: [DONE]"],
        usage: CHAT_USAGE,
        stream_error: reply::sse_error,
        refuse: refuse_nothing,
    },
    Route {
        path: "/v1/completions",
        label: "completions",
        prompt: &["prompt"],
        max_tokens: &["max_tokens"],
        prefill_cap: "max_tokens",
        one_token: OneToken::MinTokens,
        forced: &[],
        stream_ends: &[b"data: [DONE]"],
        usage: CHAT_USAGE,
        stream_error: reply::sse_error,
        refuse: refuse_nothing,
    },
    Route {
        path: "/v1/responses",
        label: "responses",
        prompt: &["instructions", "input"],
        max_tokens: &["max_output_tokens"],
        prefill_cap: "max_output_tokens",
        one_token: OneToken::IgnoreEos,
        forced: &[("store", Some(false)), ("background", None)],
        // vLLM ends a stream that failed mid-way with its own `error` event (serving.py,
        // responses_stream_generator): marked by the engine, not cut.
        stream_ends: &[
            b"event: response.completed",
            b"event: response.incomplete",
            b"event: response.failed",
            b"event: error",
        ],
        usage: UsageNames { input: "input_tokens", output: "output_tokens", input_details: "input_tokens_details" },
        stream_error: responses_error,
        refuse: refuse_stored,
    },
];

impl Route {
    pub fn find(path: &str) -> Option<&'static Route> {
        ROUTES.iter().find(|r| r.path == path)
    }

    /// The index of this row (the route's own latency histogram).
    pub fn index(&self) -> usize {
        ROUTES.iter().position(|r| std::ptr::eq(r, self)).unwrap_or(0)
    }

    /// The prefix key: the prompt fields' text (a string as is, anything else as its JSON).
    pub fn prefix(&self, body: &Map<String, Value>) -> Vec<u8> {
        let mut key = Vec::new();
        for field in self.prompt {
            match body.get(*field) {
                Some(Value::String(s)) => key.extend_from_slice(s.as_bytes()),
                Some(v) if !v.is_null() => key.extend_from_slice(&serde_json::to_vec(v).unwrap_or_default()),
                _ => {}
            }
        }
        key
    }

    /// The answer's length cap the client gave, if any (and above 0).
    pub fn max_tokens(&self, body: &Map<String, Value>) -> Option<u64> {
        self.max_tokens.iter().find_map(|k| body.get(*k).and_then(Value::as_u64)).filter(|n| *n > 0)
    }

    /// The fields both legs get whatever the client sent: `forced` (None: removed).
    pub fn force(&self, body: &mut Map<String, Value>) {
        for (k, v) in self.forced {
            match v {
                Some(b) => body.insert((*k).into(), Value::Bool(*b)),
                None => body.remove(*k),
            };
        }
    }

    /// Whether a complete SSE event (its lines) ends the stream.
    pub fn ends_stream(&self, event: &[u8]) -> bool {
        event.split(|b| *b == b'\n').any(|line| self.stream_ends.iter().any(|m| line.starts_with(m)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn map(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => Map::new(),
        }
    }

    #[test]
    fn every_row_is_found_by_its_path_and_knows_its_index() {
        for (i, r) in ROUTES.iter().enumerate() {
            assert!(std::ptr::eq(Route::find(r.path).unwrap_or(&ROUTES[0]), r));
            assert_eq!(r.index(), i);
            assert!(!r.prompt.is_empty() && !r.max_tokens.is_empty() && !r.stream_ends.is_empty());
        }
        assert!(Route::find("/v1/messages").is_none());
    }

    #[test]
    fn responses_refuse_what_needs_a_store_and_force_it_off() {
        let r = Route::find("/v1/responses").unwrap_or(&ROUTES[0]);
        assert_eq!((r.refuse)(&map(json!({"previous_response_id": "resp_1"}))), Some(NOT_STORED));
        for background in [json!(true), json!("true"), json!(1)] {
            assert!((r.refuse)(&map(json!({"background": background}))).is_some(), "{background}");
        }
        assert!((r.refuse)(&map(json!({"previous_response_id": null, "background": false, "store": true}))).is_none());
        let mut body = map(json!({"store": true, "background": false, "input": "hi"}));
        r.force(&mut body);
        assert_eq!(Value::Object(body), json!({"store": false, "input": "hi"}));
    }

    #[test]
    fn the_prefix_key_is_the_prompt_fields_in_order() {
        let r = Route::find("/v1/responses").unwrap_or(&ROUTES[0]);
        assert_eq!(r.prefix(&map(json!({"instructions": "be brief", "input": "hi"}))), b"be briefhi");
        assert_eq!(
            r.prefix(&map(json!({"input": [{"role": "user", "content": "x"}]}))),
            br#"[{"content":"x","role":"user"}]"#.to_vec()
        );
        let chat = Route::find("/v1/chat/completions").unwrap_or(&ROUTES[0]);
        assert_eq!(chat.max_tokens(&map(json!({"max_completion_tokens": 5}))), Some(5));
        assert_eq!(chat.max_tokens(&map(json!({"max_tokens": 9, "max_completion_tokens": 5}))), Some(5));
        assert_eq!(chat.max_tokens(&map(json!({"max_tokens": 0}))), None);
    }

    #[test]
    fn a_stream_ends_with_its_routes_marker_only() {
        let chat = Route::find("/v1/chat/completions").unwrap_or(&ROUTES[0]);
        let resp = Route::find("/v1/responses").unwrap_or(&ROUTES[0]);
        assert!(chat.ends_stream(b"data: [DONE]\n"));
        assert!(!chat.ends_stream(b"event: response.completed\ndata: {}\n"));
        assert!(resp.ends_stream(b"event: response.completed\ndata: {}\n"));
        assert!(!resp.ends_stream(b"event: response.output_text.delta\ndata: {\"delta\":\"[DONE]\"}\n"));
        assert!(
            String::from_utf8_lossy(&(resp.stream_error)(502, "upstream_error", "cut")).starts_with("event: error\n")
        );
    }
}
