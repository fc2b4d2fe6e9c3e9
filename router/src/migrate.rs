//! Mid-stream migration: a stream whose engine dies or stalls after tokens reached the client goes on
//! on another engine (pair) from the prompt's and the generated tokens' ids, under the same response
//! id, with usage counted over the whole answer (docs/migration.md).
//!
//! vLLM 0.33.0 gives a router what it needs: `return_token_ids` puts the prompt's ids on a stream's
//! first chunk and each chunk's own ids on it (entrypoints/openai/chat_completion/serving.py,
//! completion/protocol.py); `/v1/completions` takes a prompt of ids. A chat stream is continued on
//! `/v1/completions` (a chat request cannot carry ids) with special tokens kept, and this module
//! parses K3's think channel out of that text as vLLM's kimi_k3 reasoning parser does
//! (reasoning/kimi_k3_reasoning_parser.py): reasoning until `<|close|>think<|sep|>`, then content,
//! with the response and message channel markers dropped. A tools channel is not parsed here: a
//! stream that would need it ends with an error event instead.
//!
//! What is refused (the request then streams as before: a cut ends it with an error event): n > 1,
//! beam search, guided decoding and forced tool calls (the continuation would not know the grammar's
//! state), chat logprobs (their shape differs from the completions' the continuation returns),
//! include_reasoning false (vLLM then hides the ids), a batch of prompts, the Responses API, an open
//! or made tool call. What drifts is documented: seeds, penalties, stop strings across the cut,
//! logprobs offsets.

use crate::routes::Route;
use serde_json::{Map, Value, json};

/// Why a request cannot be moved mid-stream, checked once before it is sent (None: it can).
pub fn refusal(route: &Route, body: &Map<String, Value>) -> Option<&'static str> {
    let above_one = |k: &str| body.get(k).and_then(Value::as_u64).is_some_and(|n| n > 1);
    let set = |k: &str| body.get(k).is_some_and(|v| !v.is_null() && *v != Value::Bool(false));
    let chat = route.label == "chat_completions";
    if !chat && route.label != "completions" {
        return Some("route");
    }
    if above_one("n") || above_one("best_of") || set("use_beam_search") {
        return Some("n_above_one");
    }
    let guided = ["guided_json", "guided_regex", "guided_choice", "guided_grammar", "structured_outputs"];
    let format = body.get("response_format").and_then(|f| f.get("type")).and_then(Value::as_str);
    let forced = body.get("tool_choice").is_some_and(|c| c.is_object() || c == "required");
    if guided.iter().any(|k| set(k)) || format.is_some_and(|t| t != "text") || forced {
        return Some("guided_decoding");
    }
    if chat && (set("logprobs") || set("top_logprobs")) {
        return Some("chat_logprobs");
    }
    if chat && body.get("include_reasoning") == Some(&Value::Bool(false)) {
        return Some("include_reasoning_false");
    }
    if !chat {
        if let Some(Value::Array(items)) = body.get("prompt") {
            if items.len() > 1 && items.iter().all(|p| p.is_string() || p.is_array()) {
                return Some("prompt_batch");
            }
        }
    }
    None
}

/// Why a stream that may move stops relaying its engine's events.
#[derive(Debug, PartialEq, Eq)]
pub enum Halt {
    /// A continuation needs what the router cannot parse (a tools channel): the stream is cut.
    Refused(&'static str),
    /// The engine ended the stream with an error event of its own (vLLM aborts what is in flight
    /// when it drains or its engine core fails): the stream moves, as from any engine failure.
    EngineError(String),
}

/// The last kind of text a chat stream showed (which channel a continuation starts in).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Shown {
    Reasoning,
    Content,
    Tool,
}

/// K3's think channel split off a continuation's text, as the kimi_k3 reasoning parser does.
#[derive(Debug, Default)]
pub struct ThinkParser {
    thinking: bool,
    held: String,
}

enum Marker {
    /// `<|open|>name<|sep|>` or `<|close|>name<|sep|>` (spaces allowed inside, as vLLM's matchers
    /// allow): open?, name, bytes.
    Whole(bool, String, usize),
    /// The text may be the start of one: wait for more.
    Partial,
    /// Not a channel marker.
    Not,
}

fn marker(s: &str) -> Marker {
    let (open, rest) = if let Some(r) = s.strip_prefix("<|open|>") {
        (true, r)
    } else if let Some(r) = s.strip_prefix("<|close|>") {
        (false, r)
    } else if "<|open|>".starts_with(s) || "<|close|>".starts_with(s) {
        return Marker::Partial;
    } else {
        return Marker::Not;
    };
    let name_at = rest.len() - rest.trim_start().len();
    let after_ws = &rest[name_at..];
    let name_len = after_ws.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(after_ws.len());
    let name = &after_ws[..name_len];
    let tail = after_ws[name_len..].trim_start();
    if tail.is_empty() {
        return Marker::Partial;
    }
    if let Some(end) = tail.strip_prefix("<|sep|>") {
        return if name.is_empty() { Marker::Not } else { Marker::Whole(open, name.to_string(), s.len() - end.len()) };
    }
    if "<|sep|>".starts_with(tail) {
        return Marker::Partial;
    }
    Marker::Not
}

impl ThinkParser {
    pub fn new(thinking: bool) -> Self {
        Self { thinking, held: String::new() }
    }

    /// (reasoning, content) of the text so far; a possible marker's start is held back until it is
    /// whole or `last`. Err when the text opens a tools channel.
    pub fn feed(&mut self, text: &str, last: bool) -> Result<(String, String), &'static str> {
        self.held.push_str(text);
        let (mut reasoning, mut content) = (String::new(), String::new());
        let mut rest = std::mem::take(&mut self.held);
        loop {
            let Some(p) = rest.find("<|") else {
                self.emit(&rest, &mut reasoning, &mut content);
                break;
            };
            self.emit(&rest[..p], &mut reasoning, &mut content);
            match marker(&rest[p..]) {
                Marker::Partial if !last => {
                    self.held = rest[p..].to_string();
                    break;
                }
                Marker::Partial | Marker::Not => {
                    self.emit("<|", &mut reasoning, &mut content);
                    rest = rest[p + 2..].to_string();
                }
                Marker::Whole(open, name, len) => {
                    match (open, name.as_str()) {
                        (true, "think") => self.thinking = true,
                        (false, "think") => self.thinking = false,
                        (true, "tools") => return Err("tool_call_after_migration"),
                        _ => {} // response and message channel markers: dropped, as vLLM drops them
                    }
                    rest = rest[p + len..].to_string();
                }
            }
        }
        Ok((reasoning, content))
    }

    fn emit(&self, text: &str, reasoning: &mut String, content: &mut String) {
        if self.thinking { reasoning } else { content }.push_str(text);
    }
}

/// What a relay keeps of a stream to move it: ids, the response's identity, what was shown.
pub struct Resume {
    chat: bool,
    /// The client asked for token ids itself: they stay in its chunks.
    client_ids: bool,
    tools: bool,
    prompt_ids: Option<Vec<Value>>,
    generated: Vec<Value>,
    id: Option<Value>,
    created: Option<Value>,
    model: Option<Value>,
    shown: Option<Shown>,
    /// Tokens since the last chunk that showed text (a tools channel the parser holds back).
    held: usize,
    pub migrations: u32,
    /// A chat stream continued on /v1/completions: its chunks are made chat chunks here.
    parser: Option<ThinkParser>,
    /// A chat stream restarted whole (nothing but its role chunk had been shown): the new stream's
    /// role chunk is dropped.
    skip_role: bool,
    /// Ids the client was sent already and the continuation sends again (tokens rolled back).
    skip_ids: usize,
    /// A chunk with a finish reason went out: the answer is whole, nothing is to be continued.
    pub finished: bool,
}

/// What vLLM's /v1/completions takes as max_tokens when a request names none
/// (entrypoints/openai/completion/protocol.py: `max_tokens: int | None = 16`, null included).
const COMPLETIONS_DEFAULT_MAX_TOKENS: u64 = 16;

/// A continuation request: the route to send it on and its body.
pub struct Continuation {
    pub route: &'static Route,
    pub body: Map<String, Value>,
    /// A chat request named no cap, whose default is the room left in the context; /v1/completions'
    /// default is 16, so the router sets max_tokens to that room (max_model_len - the prompt's ids)
    /// once it has read an engine's max_model_len.
    pub needs_room: bool,
}

/// The sampling fields a chat request shares with /v1/completions (what a continuation keeps).
const SHARED: &[&str] = &[
    "model",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "stop_token_ids",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logit_bias",
    "bad_words",
    "ignore_eos",
    "include_stop_str_in_output",
    "stream_options",
    "user",
    "priority",
];

impl Resume {
    /// The original body's `return_token_ids` is read before the router sets it on the legs.
    pub fn new(route: &Route, body: &Map<String, Value>) -> Self {
        let tools = body.get("tools").and_then(Value::as_array).is_some_and(|t| !t.is_empty())
            && body.get("tool_choice").and_then(Value::as_str) != Some("none");
        Self {
            chat: route.label == "chat_completions",
            client_ids: body.get("return_token_ids") == Some(&Value::Bool(true)),
            tools,
            prompt_ids: None,
            generated: Vec::new(),
            id: None,
            created: None,
            model: None,
            shown: None,
            held: 0,
            migrations: 0,
            parser: None,
            skip_role: false,
            skip_ids: 0,
            finished: false,
        }
    }

    /// The prompt's token ids as the engine gave them (the stream's `prompt_token_ids`).
    pub fn prompt_ids(&self) -> Option<Vec<u64>> {
        self.prompt_ids.as_ref()?.iter().map(Value::as_u64).collect()
    }

    pub fn generated(&self) -> usize {
        self.generated.len()
    }

    /// Why this stream cannot move now (None: it can).
    pub fn blocked(&self) -> Option<&'static str> {
        if self.prompt_ids.is_none() {
            return Some("no_token_ids");
        }
        if self.chat && self.parser.is_none() {
            if self.shown == Some(Shown::Tool) || (self.tools && self.held > 0) {
                return Some("tool_call_open");
            }
            if self.tools && self.shown.is_none() && !self.generated.is_empty() {
                return Some("tool_call_open"); // tokens, nothing shown: held back by the tool parser
            }
        }
        None
    }

    /// The request that goes on from here: /v1/completions from prompt + generated ids (a chat
    /// stream restarts whole on its own route when it had shown nothing but its role). None when
    /// the answer's cap is already spent.
    pub fn continuation(&mut self, route: &'static Route, original: &Map<String, Value>) -> Option<Continuation> {
        // Tokens a chat parser held back (part of a channel marker) showed no text: they are
        // generated again, so that the continuation's text holds the whole marker.
        if self.chat && self.parser.is_none() && self.held > 0 {
            let keep = self.generated.len().saturating_sub(self.held);
            self.generated.truncate(keep);
            self.skip_ids = if self.client_ids { self.held } else { 0 };
            self.held = 0;
        }
        let g = self.generated.len() as u64;
        let prompt_ids = self.prompt_ids.clone()?;
        if self.chat && g == 0 && self.parser.is_none() {
            self.skip_role = true;
            return Some(Continuation { route, body: original.clone(), needs_room: false });
        }
        let completions = crate::routes::Route::find("/v1/completions")?;
        let named = route.max_tokens.iter().find_map(|k| original.get(*k).and_then(Value::as_u64));
        let cap = if self.chat { named } else { Some(named.unwrap_or(COMPLETIONS_DEFAULT_MAX_TOKENS)) };
        let mut body = if self.chat {
            SHARED.iter().filter_map(|k| original.get(*k).map(|v| ((*k).to_string(), v.clone()))).collect()
        } else {
            let mut b = original.clone();
            b.remove("prompt_logprobs");
            b.insert("echo".into(), Value::Bool(false));
            b
        };
        if let Some(cap) = cap {
            let left = cap.checked_sub(g).filter(|n| *n > 0)?;
            body.insert("max_tokens".into(), left.into());
        }
        if let Some(min) = original.get("min_tokens").and_then(Value::as_u64) {
            body.insert("min_tokens".into(), min.saturating_sub(g).into());
        }
        let mut prompt = prompt_ids;
        prompt.extend(self.generated.iter().cloned());
        body.insert("prompt".into(), Value::Array(prompt));
        body.insert("stream".into(), Value::Bool(true));
        body.insert("return_token_ids".into(), Value::Bool(true));
        if self.chat {
            body.insert("skip_special_tokens".into(), Value::Bool(false));
            body.insert("spaces_between_special_tokens".into(), Value::Bool(false));
            // A later move keeps the parser: the text it holds back belongs to ids already generated.
            if self.parser.is_none() {
                self.parser = Some(ThinkParser::new(self.shown == Some(Shown::Reasoning)));
            }
        }
        Some(Continuation { route: completions, body, needs_room: self.chat && cap.is_none() })
    }

    /// One SSE event's JSON, rewritten for the client: the first response's id and created time,
    /// ids collected (and removed unless the client asked for them), usage over the whole answer
    /// once the stream has moved, a continuation's completion chunks made chat chunks. Ok(None):
    /// nothing to send; Err: nothing more of this engine's stream is relayed (why).
    pub fn event(&mut self, json: &[u8]) -> Result<Option<Vec<u8>>, Halt> {
        let Ok(Value::Object(mut v)) = serde_json::from_slice::<Value>(json) else {
            return Ok(Some(json.to_vec()));
        };
        if let Some(error) = v.get("error") {
            let message = error.get("message").and_then(Value::as_str).unwrap_or("an error event");
            return Err(Halt::EngineError(format!("the engine ended the stream with an error: {message}")));
        }
        if self.id.is_none() {
            self.id = v.get("id").cloned();
            self.created = v.get("created").cloned();
            self.model = v.get("model").cloned();
        }
        if let Some(parser) = self.parser.as_mut() {
            if first_choice(&mut v).is_some_and(|c| c.get("finish_reason").is_some_and(|f| !f.is_null())) {
                self.finished = true;
            }
            return chat_from_completion(parser, &mut v, &mut self.generated, self.client_ids, &mut self.skip_ids)
                .map(|o| {
                    o.map(|mut c| {
                        self.identity(&mut c);
                        self.usage(&mut c);
                        serde_json::to_vec(&c).unwrap_or_default()
                    })
                })
                .map_err(Halt::Refused);
        }
        let prompt = if self.chat {
            v.remove("prompt_token_ids")
        } else {
            first_choice(&mut v).and_then(|c| c.insert("prompt_token_ids".into(), Value::Null))
        };
        if let Some(Value::Array(ids)) = prompt {
            if self.prompt_ids.is_none() {
                if self.client_ids {
                    put_prompt_ids(&mut v, self.chat, Value::Array(ids.clone()));
                }
                self.prompt_ids = Some(ids);
            }
        }
        let role =
            self.chat && first_choice(&mut v).is_some_and(|c| c.get("delta").and_then(|d| d.get("role")).is_some());
        if role && self.skip_role {
            self.skip_role = false;
            return Ok(None);
        }
        if let Some(c) = first_choice(&mut v) {
            if c.get("finish_reason").is_some_and(|f| !f.is_null()) {
                self.finished = true;
            }
            let mut ids = c.remove("token_ids");
            let n = match &mut ids {
                Some(Value::Array(ids)) => {
                    self.generated.extend(ids.iter().cloned());
                    let sent = self.skip_ids.min(ids.len());
                    ids.drain(..sent);
                    self.skip_ids -= sent;
                    ids.len() + sent
                }
                _ => 0,
            };
            if self.client_ids {
                if let Some(ids) = ids {
                    c.insert("token_ids".into(), ids);
                }
            } else if !self.chat {
                c.insert("token_ids".into(), Value::Null);
            }
            if self.chat && !role {
                let delta = c.get("delta");
                let has =
                    |k: &str| delta.and_then(|d| d.get(k)).is_some_and(|x| x.as_str().is_some_and(|s| !s.is_empty()));
                let shown = if delta.and_then(|d| d.get("tool_calls")).is_some_and(|t| !t.is_null()) {
                    Some(Shown::Tool)
                } else if has("content") {
                    Some(Shown::Content)
                } else if has("reasoning") {
                    Some(Shown::Reasoning)
                } else {
                    None
                };
                match shown {
                    Some(s) => {
                        self.shown = Some(s);
                        self.held = 0;
                    }
                    None => self.held += n,
                }
                // vLLM sends a chunk with nothing to show only for its ids: none asked, none sent.
                let ids_only = n > 0 && c.get("delta").is_some_and(Value::is_object);
                if shown.is_none() && ids_only && !self.client_ids && c.get("finish_reason").is_none_or(Value::is_null)
                {
                    return Ok(None);
                }
            }
        }
        if self.migrations > 0 {
            self.identity(&mut v);
            self.usage(&mut v);
        }
        Ok(Some(serde_json::to_vec(&v).unwrap_or_default()))
    }

    fn identity(&self, v: &mut Map<String, Value>) {
        for (k, x) in [("id", &self.id), ("created", &self.created), ("model", &self.model)] {
            if let Some(x) = x {
                v.insert(k.into(), x.clone());
            }
        }
    }

    /// Usage over the whole answer: the first prompt's tokens and every token generated.
    fn usage(&self, v: &mut Map<String, Value>) {
        if self.migrations == 0 {
            return;
        }
        let Some(u) = v.get_mut("usage").and_then(Value::as_object_mut) else {
            return;
        };
        let prompt = self.prompt_ids.as_ref().map_or(0, Vec::len) as u64;
        let completion = self.generated.len() as u64;
        u.insert("prompt_tokens".into(), prompt.into());
        u.insert("completion_tokens".into(), completion.into());
        u.insert("total_tokens".into(), (prompt + completion).into());
        // The continuation's cached tokens count its longer prompt: never more than the first's.
        if let Some(d) = u.get_mut("prompt_tokens_details").and_then(Value::as_object_mut) {
            if d.get("cached_tokens").and_then(Value::as_u64).is_some_and(|c| c > prompt) {
                d.insert("cached_tokens".into(), prompt.into());
            }
        }
    }
}

fn first_choice(v: &mut Map<String, Value>) -> Option<&mut Map<String, Value>> {
    v.get_mut("choices").and_then(Value::as_array_mut).and_then(|c| c.first_mut()).and_then(Value::as_object_mut)
}

fn put_prompt_ids(v: &mut Map<String, Value>, chat: bool, ids: Value) {
    if chat {
        v.insert("prompt_token_ids".into(), ids);
    } else if let Some(c) = first_choice(v) {
        c.insert("prompt_token_ids".into(), ids);
    }
}

/// A continuation's /v1/completions chunk as the chat chunk vLLM's chat route would have sent.
fn chat_from_completion(
    parser: &mut ThinkParser,
    v: &mut Map<String, Value>,
    generated: &mut Vec<Value>,
    client_ids: bool,
    skip_ids: &mut usize,
) -> Result<Option<Map<String, Value>>, &'static str> {
    let mut out = Map::new();
    out.insert("object".into(), "chat.completion.chunk".into());
    let Some(c) = first_choice(v) else {
        // The usage chunk (no choices).
        out.insert("choices".into(), json!([]));
        if let Some(u) = v.remove("usage") {
            out.insert("usage".into(), u);
        }
        return Ok(Some(out));
    };
    let mut ids = c.remove("token_ids");
    if let Some(Value::Array(ids)) = &mut ids {
        generated.extend(ids.iter().cloned());
        let sent = (*skip_ids).min(ids.len());
        ids.drain(..sent);
        *skip_ids -= sent;
    }
    let finish = c.remove("finish_reason").filter(|f| !f.is_null());
    let text = c.get("text").and_then(Value::as_str).unwrap_or_default();
    let (reasoning, content) = parser.feed(text, finish.is_some())?;
    let mut delta = Map::new();
    if !reasoning.is_empty() {
        delta.insert("reasoning".into(), reasoning.into());
    }
    if !content.is_empty() {
        delta.insert("content".into(), content.into());
    }
    if delta.is_empty() && finish.is_none() && !client_ids {
        return Ok(None);
    }
    let mut choice = Map::new();
    choice.insert("index".into(), 0.into());
    choice.insert("delta".into(), Value::Object(delta));
    choice.insert("logprobs".into(), Value::Null);
    choice.insert("finish_reason".into(), finish.clone().unwrap_or(Value::Null));
    if finish.is_some() {
        choice.insert("stop_reason".into(), c.remove("stop_reason").unwrap_or(Value::Null));
    }
    if client_ids {
        choice.insert("token_ids".into(), ids.unwrap_or(Value::Null));
    }
    out.insert("choices".into(), Value::Array(vec![Value::Object(choice)]));
    if let Some(u) = v.remove("usage") {
        out.insert("usage".into(), u);
    }
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(path: &str) -> &'static Route {
        Route::find(path).unwrap_or(&crate::routes::ROUTES[0])
    }

    fn map(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => Map::new(),
        }
    }

    #[test]
    fn the_think_parser_splits_at_the_close_marker_across_chunks_and_drops_channel_markers() {
        let mut p = ThinkParser::new(true);
        let mut all = (String::new(), String::new());
        for piece in ["Let me", " think<|cl", "ose|>th", "ink<|sep|>Hello", "<|close|>response<|sep|>", " there"] {
            let (r, c) = p.feed(piece, false).unwrap_or_default();
            all.0 += &r;
            all.1 += &c;
        }
        assert_eq!(all, ("Let me think".to_string(), "Hello there".to_string()));
        let mut q = ThinkParser::new(false);
        assert_eq!(q.feed("a <| b", true).unwrap_or_default(), (String::new(), "a <| b".to_string()));
        assert_eq!(ThinkParser::new(false).feed("x<|open|> tools <|sep|>", false), Err("tool_call_after_migration"));
        let mut held = ThinkParser::new(true);
        assert_eq!(held.feed("r<|close|> think", false).unwrap_or_default(), ("r".to_string(), String::new()));
        assert_eq!(held.feed("", true).unwrap_or_default(), ("<|close|> think".to_string(), String::new()));
    }

    #[test]
    fn what_cannot_move_is_refused_before_it_is_sent() {
        let chat = route("/v1/chat/completions");
        let completions = route("/v1/completions");
        assert_eq!(refusal(chat, &map(json!({"messages": []}))), None);
        assert_eq!(refusal(chat, &map(json!({"n": 2}))), Some("n_above_one"));
        assert_eq!(refusal(chat, &map(json!({"response_format": {"type": "json_object"}}))), Some("guided_decoding"));
        assert_eq!(refusal(chat, &map(json!({"response_format": {"type": "text"}}))), None);
        assert_eq!(refusal(chat, &map(json!({"tool_choice": "required"}))), Some("guided_decoding"));
        assert_eq!(refusal(chat, &map(json!({"logprobs": true}))), Some("chat_logprobs"));
        assert_eq!(refusal(chat, &map(json!({"include_reasoning": false}))), Some("include_reasoning_false"));
        assert_eq!(refusal(completions, &map(json!({"prompt": ["a", "b"]}))), Some("prompt_batch"));
        assert_eq!(refusal(completions, &map(json!({"prompt": [1, 2]}))), None);
        assert_eq!(refusal(completions, &map(json!({"logprobs": 2}))), None);
        assert_eq!(refusal(route("/v1/responses"), &Map::new()), Some("route"));
    }

    #[test]
    fn a_completion_moves_with_its_ids_and_its_usage_counts_the_whole_answer() {
        let completions = route("/v1/completions");
        let body = map(json!({"prompt": "a b c", "max_tokens": 10, "min_tokens": 4, "echo": true}));
        let mut r = Resume::new(completions, &body);
        let first = br#"{"id":"cmpl-1","created":5,"model":"m","choices":[{"index":0,"text":"x","prompt_token_ids":[1,2,3],"token_ids":[7]}]}"#;
        let out = r.event(first).ok().flatten().unwrap_or_default();
        let shown: Value = serde_json::from_slice(&out).unwrap_or_default();
        assert_eq!(shown["choices"][0]["token_ids"], Value::Null, "the client asked for no ids");
        assert_eq!(shown["choices"][0]["prompt_token_ids"], Value::Null);
        let _ = r.event(br#"{"id":"cmpl-1","choices":[{"index":0,"text":" y","token_ids":[8,9]}]}"#);
        assert_eq!(r.blocked(), None);
        let next = r.continuation(completions, &body).map(|c| c.body).unwrap_or_default();
        assert_eq!(next["prompt"], json!([1, 2, 3, 7, 8, 9]));
        assert_eq!(
            (next["max_tokens"].clone(), next["min_tokens"].clone(), next["echo"].clone()),
            (json!(7), json!(1), json!(false))
        );
        r.migrations = 1;
        let moved = r.event(br#"{"id":"cmpl-2","created":9,"choices":[],"usage":{"prompt_tokens":6,"completion_tokens":7,"total_tokens":13}}"#);
        let moved: Value = serde_json::from_slice(&moved.ok().flatten().unwrap_or_default()).unwrap_or_default();
        assert_eq!((moved["id"].clone(), moved["created"].clone()), (json!("cmpl-1"), json!(5)));
        assert_eq!(moved["usage"], json!({"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}));
    }

    #[test]
    fn a_chat_stream_moves_to_completions_and_comes_back_as_chat_chunks() {
        let chat = route("/v1/chat/completions");
        let body = map(json!({"messages": [], "max_completion_tokens": 20, "temperature": 0.5,
                              "chat_template_kwargs": {"thinking": true}}));
        let mut r = Resume::new(chat, &body);
        let role = br#"{"id":"chatcmpl-1","created":5,"model":"m","prompt_token_ids":[1,2],"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#;
        assert!(r.event(role).ok().flatten().is_some());
        let _ = r.event(br#"{"id":"chatcmpl-1","choices":[{"index":0,"delta":{"reasoning":"Let"},"token_ids":[11]}]}"#);
        let next = r.continuation(chat, &body).map(|c| (c.route.path, c.body));
        let (path, next) = next.unwrap_or(("", Map::new()));
        assert_eq!(path, "/v1/completions");
        assert_eq!(
            (next["prompt"].clone(), next["max_tokens"].clone(), next["temperature"].clone()),
            (json!([1, 2, 11]), json!(19), json!(0.5))
        );
        assert!(next.get("messages").is_none() && next["skip_special_tokens"] == json!(false));
        r.migrations = 1;
        let c = r.event(br#"{"id":"cmpl-9","object":"text_completion","choices":[{"index":0,"text":" me<|close|>think<|sep|>Hi","token_ids":[12,13,14,15,16]}]}"#);
        let c: Value = serde_json::from_slice(&c.ok().flatten().unwrap_or_default()).unwrap_or_default();
        assert_eq!(c["object"], json!("chat.completion.chunk"));
        assert_eq!(c["id"], json!("chatcmpl-1"));
        assert_eq!(c["choices"][0]["delta"], json!({"reasoning": " me", "content": "Hi"}));
        assert_eq!(r.generated(), 6);
    }

    #[test]
    fn tokens_a_chat_parser_held_back_are_generated_again_so_the_marker_is_whole() {
        let chat = route("/v1/chat/completions");
        let body = map(json!({"messages": [], "max_tokens": 20, "return_token_ids": true}));
        let mut r = Resume::new(chat, &body);
        let _ = r.event(
            br#"{"id":"c","prompt_token_ids":[1],"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#,
        );
        let _ = r.event(br#"{"id":"c","choices":[{"index":0,"delta":{"reasoning":"Let"},"token_ids":[11]}]}"#);
        // `<|close|>` alone: the parser shows nothing, the client gets its id.
        let held = r.event(br#"{"id":"c","choices":[{"index":0,"delta":{},"token_ids":[12]}]}"#);
        assert!(held.ok().flatten().is_some(), "the client asked for ids: the chunk goes out");
        assert_eq!(r.blocked(), None, "no tools offered: a held marker is not a tool call");
        let next = r.continuation(chat, &body).map(|c| c.body).unwrap_or_default();
        assert_eq!((next["prompt"].clone(), next["max_tokens"].clone()), (json!([1, 11]), json!(19)));
        r.migrations = 1;
        let c = r
            .event(br#"{"id":"x","choices":[{"index":0,"text":"<|close|>think<|sep|>Hi","token_ids":[12,13,14,15]}]}"#);
        let c: Value = serde_json::from_slice(&c.ok().flatten().unwrap_or_default()).unwrap_or_default();
        assert_eq!(c["choices"][0]["delta"], json!({"content": "Hi"}));
        assert_eq!(c["choices"][0]["token_ids"], json!([13, 14, 15]), "12 was sent once already");
        assert_eq!(r.generated(), 5);
    }

    #[test]
    fn caps_follow_vllms_defaults_and_a_finished_answer_is_not_continued() {
        let completions = route("/v1/completions");
        let body = map(json!({"prompt": "a"}));
        let mut r = Resume::new(completions, &body);
        let _ = r.event(br#"{"id":"c","choices":[{"index":0,"text":"x","prompt_token_ids":[1],"token_ids":[7,8]}]}"#);
        let next = r.continuation(completions, &body).unwrap_or_else(|| Continuation {
            route: completions,
            body: Map::new(),
            needs_room: true,
        });
        assert_eq!(
            (next.body["max_tokens"].clone(), next.needs_room),
            (json!(14), false),
            "vLLM's completions default is 16"
        );
        let chat = route("/v1/chat/completions");
        let mut c = Resume::new(chat, &map(json!({"messages": []})));
        let _ = c.event(
            br#"{"id":"c","prompt_token_ids":[1],"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#,
        );
        let _ = c.event(br#"{"id":"c","choices":[{"index":0,"delta":{"content":"Hi"},"token_ids":[5]}]}"#);
        let next = c.continuation(chat, &map(json!({"messages": []})));
        assert!(next.as_ref().is_some_and(|n| n.needs_room && !n.body.contains_key("max_tokens")));
        assert!(!c.finished);
        let _ = c.event(br#"{"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop","token_ids":[2]}]}"#);
        assert!(c.finished);
    }

    #[test]
    fn a_second_move_keeps_the_text_the_think_parser_holds() {
        let chat = route("/v1/chat/completions");
        let body = map(json!({"messages": [], "max_tokens": 50}));
        let mut r = Resume::new(chat, &body);
        let _ = r.event(
            br#"{"id":"c","prompt_token_ids":[1],"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#,
        );
        let _ = r.event(br#"{"id":"c","choices":[{"index":0,"delta":{"reasoning":"Let"},"token_ids":[11]}]}"#);
        let _ = r.continuation(chat, &body);
        r.migrations = 1;
        let _ = r.event(br#"{"id":"x","choices":[{"index":0,"text":" me<|close|> think","token_ids":[12,13,14]}]}"#);
        let _ = r.continuation(chat, &body);
        r.migrations = 2;
        let c = r.event(br#"{"id":"y","choices":[{"index":0,"text":"<|sep|>Hi","token_ids":[15,16]}]}"#);
        let c: Value = serde_json::from_slice(&c.ok().flatten().unwrap_or_default()).unwrap_or_default();
        assert_eq!(c["choices"][0]["delta"], json!({"content": "Hi"}));
    }

    #[test]
    fn a_chat_stream_holding_a_tool_call_back_does_not_move() {
        let chat = route("/v1/chat/completions");
        let body = map(json!({"messages": [], "tools": [{"type": "function"}]}));
        let mut r = Resume::new(chat, &body);
        let _ = r.event(
            br#"{"id":"c","prompt_token_ids":[1],"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#,
        );
        let _ = r.event(br#"{"id":"c","choices":[{"index":0,"delta":{"content":"ok"},"token_ids":[5]}]}"#);
        assert_eq!(r.blocked(), None);
        assert_eq!(r.event(br#"{"id":"c","choices":[{"index":0,"delta":{},"token_ids":[6]}]}"#), Ok(None));
        assert_eq!(r.blocked(), Some("tool_call_open"));
    }
}
