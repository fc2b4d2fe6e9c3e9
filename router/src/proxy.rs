//! The request path: routes, the NIXL pull hand-off (prefill leg, then decode leg with the
//! prefill's kv_transfer_params), failover by the engine's rules, stream relay and watchdogs.
//!
//! The retry rules (vLLM 0.33.0's NIXL connector frees the prefill's blocks after the expected read,
//! and a second read of the same params silently returns wrong KV):
//! - a failed prefill leg is retried on another prefill (nothing was handed off);
//! - a decode leg goes to another decode with the SAME params only when the first decode provably
//!   never received it: its TCP connect was refused or timed out (no byte written);
//! - any other decode failure before a byte reached the client (5xx, reset, watchdog, probes say
//!   it died) runs the prefill again for fresh params; one set of params never reaches two decodes;
//! - after a byte reached the client, a failure ends the stream with an SSE error event.

use crate::config::{Config, Mode, PolicyKind};
use crate::engines::{Registry, Role, Worker};
use crate::metrics::METRICS;
use crate::migrate::{Continuation, Halt, Resume, refusal};
use crate::policy::{Policy, RouteInput, session_key};
use crate::prompt_ids::PromptIds;
use crate::reply::{self, Body};
use crate::routes::Route;
use crate::trace::{Kind, Span};
use crate::upstream::{self, SendError};
use crate::usage;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::{Body as _, Frame, Incoming};
use hyper::{Request, Response};
use serde_json::{Map, Value, json};
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::watch;
use tokio::time::{Sleep, sleep_until};

const ANSWER_CAP: usize = 64 << 20;
/// How much of a body over --max-payload-size is read and dropped before the 413 goes out.
const DRAIN_CAP: usize = 64 << 20;
const DRAIN_TIME: Duration = Duration::from_secs(2);

/// Retries allowed: at most `ratio` x the requests of the last 10 s, plus `floor`.
pub struct RetryBudget {
    window: Mutex<[(u64, u64, u64); 10]>,
    ratio: f64,
    floor: u32,
    start: Instant,
}

impl RetryBudget {
    pub fn new(ratio: f64, floor: u32) -> Self {
        Self { window: Mutex::new([(u64::MAX, 0, 0); 10]), ratio, floor, start: Instant::now() }
    }

    fn bucket<R>(&self, f: impl FnOnce(&mut [(u64, u64, u64); 10], usize, u64) -> R) -> Option<R> {
        let sec = self.start.elapsed().as_secs();
        let mut w = self.window.lock().ok()?;
        let slot = (sec % 10) as usize;
        if let Some(b) = w.get_mut(slot) {
            if b.0 != sec {
                *b = (sec, 0, 0);
            }
        }
        Some(f(&mut w, slot, sec))
    }

    pub fn record_request(&self) {
        self.bucket(|w, slot, _| {
            if let Some(b) = w.get_mut(slot) {
                b.1 += 1;
            }
        });
    }

    pub fn try_retry(&self) -> bool {
        let (ratio, floor) = (self.ratio, self.floor);
        self.bucket(|w, slot, sec| {
            let recent = w.iter().filter(|b| b.0 != u64::MAX && sec.saturating_sub(b.0) < 10);
            let (requests, retries) = recent.fold((0u64, 0u64), |(r, t), b| (r + b.1, t + b.2));
            if (retries as f64) < ratio * requests as f64 + f64::from(floor) {
                if let Some(b) = w.get_mut(slot) {
                    b.2 += 1;
                }
                true
            } else {
                false
            }
        })
        .unwrap_or(false)
    }
}

pub struct App {
    pub cfg: Arc<Config>,
    pub reg: Arc<Registry>,
    prefill_policy: Policy,
    decode_policy: Policy,
    aggregated_policy: Policy,
    budget: RetryBudget,
    pub draining: AtomicBool,
    pub in_flight: AtomicUsize,
    ids: AtomicU64,
    created: u64,
    /// Token ids of chat prompts seen, for precise_prefix's continuing chats (prompt_ids.rs).
    prompt_ids: PromptIds,
}

pub(crate) fn seed() -> u64 {
    let mut buf = [0u8; 8];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        let _ = std::io::Read::read_exact(&mut f, &mut buf);
    }
    let t = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos() as u64;
    u64::from_le_bytes(buf) ^ t ^ u64::from(std::process::id())
}

/// Counts a client request in flight until dropped (for streams: when the relay ends).
struct InFlight(Arc<App>, Instant, &'static Route);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
        METRICS.set("kimik3_router_in_flight_requests", &[], self.0.in_flight.load(Ordering::Relaxed) as f64);
        if let Some(h) = METRICS.duration.get(self.2.index()) {
            h.observe(self.1.elapsed());
        }
    }
}

/// Load held on a worker while a leg runs on it.
struct LoadGuard(Arc<Worker>);

impl LoadGuard {
    fn new(w: &Arc<Worker>) -> Self {
        w.load.fetch_add(1, Ordering::Relaxed);
        let n = w.endpoint.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        METRICS.set(
            "kimik3_router_engine_in_flight",
            &[("role", w.endpoint.role.name()), ("engine", &w.endpoint.authority)],
            n as f64,
        );
        Self(w.clone())
    }
}

impl Drop for LoadGuard {
    fn drop(&mut self) {
        self.0.load.fetch_sub(1, Ordering::Relaxed);
        let n = self.0.endpoint.in_flight.fetch_sub(1, Ordering::Relaxed).saturating_sub(1);
        if !self.0.endpoint.removed.load(Ordering::Relaxed) {
            METRICS.set(
                "kimik3_router_engine_in_flight",
                &[("role", self.0.endpoint.role.name()), ("engine", &self.0.endpoint.authority)],
                n as f64,
            );
        }
    }
}

/// Why a leg failed.
#[derive(Debug)]
enum Failure {
    /// No byte reached the engine (connect refused or timed out).
    NotTaken(String),
    /// The engine may have received the request.
    Sent(&'static str, String),
    /// A watchdog fired before an answer (first-token deadline) or the request deadline passed.
    Timeout(&'static str, String),
}

impl Failure {
    fn outcome(&self) -> &'static str {
        match self {
            Self::NotTaken(_) => "connect_failed",
            Self::Sent(o, _) | Self::Timeout(o, _) => o,
        }
    }

    /// A leg's span, failed with this failure's outcome and message.
    fn mark(&self, span: &Span) {
        span.set("kimik3.outcome", self.outcome());
        span.fail(&self.client_error().2);
    }

    fn client_error(&self) -> (u16, &'static str, String) {
        match self {
            Self::NotTaken(m) => (502, "upstream_error", format!("no engine could be reached: {m}")),
            Self::Sent(_, m) => (502, "upstream_error", format!("the engine failed: {m}")),
            Self::Timeout(_, m) => (504, "timeout", m.clone()),
        }
    }
}

/// A watchdog that fired: the leg's outcome and the client's message if it was the last failure.
type Late = (&'static str, &'static str);
const FIRST_TOKEN_LATE: Late = ("first_token_timeout", "the engine did not answer in time");
const WHOLE_ANSWER_LATE: Late = ("answer_timeout", "no answer in time");

enum Leg {
    /// The answer to give the client (committed: a byte may already be on its way).
    Answer(Response<Body>),
    /// A stream whose first chunk is in: what a relay needs to carry it on.
    Stream(Upstream),
    Failed(Failure),
}

/// An engine's stream once its first chunk is in.
struct Upstream {
    first: Bytes,
    arrived: Instant,
    incoming: Incoming,
    worker: Arc<Worker>,
    /// Held while the stream runs on the worker.
    _load: LoadGuard,
    span: Arc<Span>,
    prefill: Option<Value>,
    content_type: HeaderValue,
}

/// What serving a request came to: an answer to give as is, or a stream to relay.
enum Served {
    Done(Response<Body>),
    Stream(Upstream),
}

/// One client request on its way.
struct Ctx {
    route: &'static Route,
    body: Map<String, Value>,
    stream: bool,
    client_request_id: Option<HeaderValue>,
    /// The request's server span (trace.rs): legs are its children; a stream's relay holds it.
    span: Arc<Span>,
    base_id: String,
    started: Instant,
    /// When the request body's last byte was in (`started` is its headers').
    body_in: Instant,
    deadline: Instant,
    first_token: Duration,
    /// A whole (non-streamed) answer's allowance past the first-token deadline: max_tokens idle
    /// gaps, the most a stream of that length could take without the idle-gap watchdog cutting it.
    /// None when the request names no max_tokens (only the request deadline bounds it then).
    whole_answer: Option<Duration>,
    session: Option<String>,
    prefix: Vec<u8>,
    sent_first: AtomicBool,
    /// A stream's migration state (migrate.rs), or why it cannot move; the relay takes it.
    resume: Mutex<Option<Result<Resume, &'static str>>>,
    /// Engines (worker ids) not to send the answer leg to: a continuation avoids the engine whose
    /// stream just failed, which may only be stalled and still look healthy.
    avoid: Vec<u64>,
    /// The prompt's token ids, once looked for (precise_prefix: the body's, a chat's it continues,
    /// else an engine's /tokenize), and where they came from.
    ids: std::sync::OnceLock<Option<Vec<u64>>>,
    ids_source: std::sync::OnceLock<&'static str>,
    /// A chat's keys in the prompt ids the router keeps (prompt_ids.rs); empty unless precise_prefix.
    keys: Vec<u64>,
}

enum Stop {
    Deadline,
    Down,
}

/// Run `fut` unless `until` passes or the engine's probes declare it dead first.
async fn guarded<T>(fut: impl Future<Output = T>, until: Instant, down: &mut watch::Receiver<bool>) -> Result<T, Stop> {
    let dead = async {
        if down.wait_for(|d| *d).await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        r = fut => Ok(r),
        _ = sleep_until(until.into()) => Err(Stop::Deadline),
        _ = dead => Err(Stop::Down),
    }
}

/// The next non-empty data frame of an upstream body, polled; Ready(Ok(None)) at its end.
fn poll_data(body: &mut Incoming, cx: &mut Context<'_>) -> Poll<Result<Option<Bytes>, String>> {
    loop {
        match Pin::new(&mut *body).poll_frame(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(None) => return Poll::Ready(Ok(None)),
            Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(e.to_string())),
            Poll::Ready(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    if !data.is_empty() {
                        return Poll::Ready(Ok(Some(data)));
                    }
                }
            }
        }
    }
}

/// The next non-empty data frame of an upstream body; Ok(None) at its end.
async fn next_data(body: &mut Incoming) -> Result<Option<Bytes>, String> {
    std::future::poll_fn(|cx| poll_data(body, cx)).await
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Relays SSE events as they complete, rewriting the one that carries usage (P/D), and every one
/// of a stream that may move (migrate.rs: ids collected, identity and usage kept whole).
struct SseRelay {
    route: &'static Route,
    buf: Vec<u8>,
    prefill: Option<Value>,
    saw_done: bool,
    resume: Option<Resume>,
    /// Why nothing more of this engine's stream is relayed (migrate.rs): the relay acts on it.
    halt: Option<Halt>,
}

impl SseRelay {
    fn new(route: &'static Route, prefill: Option<Value>, resume: Option<Resume>) -> Self {
        Self { route, buf: Vec::new(), prefill, saw_done: false, resume, halt: None }
    }

    fn push(&mut self, data: Bytes) -> Option<Bytes> {
        let simple = self.resume.is_none()
            && self.buf.is_empty()
            && data.ends_with(b"\n\n")
            && (self.prefill.is_none() || find(&data, b"\"usage\"").is_none());
        if simple {
            if self.route.ends_stream(&data) {
                self.saw_done = true;
            }
            return Some(data);
        }
        self.buf.extend_from_slice(&data);
        let end = self.buf.windows(2).rposition(|w| w == b"\n\n")? + 2;
        let complete: Vec<u8> = self.buf.drain(..end).collect();
        let mut out = Vec::with_capacity(complete.len() + 64);
        for event in complete.split_inclusive(|b| *b == b'\n').collect::<Vec<_>>().split(|l| *l == b"\n") {
            if event.is_empty() || self.halt.is_some() {
                continue;
            }
            let mut lines = Vec::with_capacity(event.len());
            for line in event {
                let Some(json) = line.strip_prefix(b"data: ").filter(|j| j.starts_with(b"{")) else {
                    lines.push(line.to_vec());
                    continue;
                };
                let json = json.strip_suffix(b"\n").unwrap_or(json);
                let mut json = match self.resume.as_mut().map(|r| r.event(json)) {
                    None => json.to_vec(),
                    Some(Ok(Some(rewritten))) => rewritten,
                    Some(Ok(None)) => {
                        lines.clear();
                        break;
                    }
                    Some(Err(halt)) => {
                        self.halt = Some(halt);
                        lines.clear();
                        break;
                    }
                };
                if let Some(prefill) = &self.prefill {
                    if find(&json, b"\"usage\"").is_some() {
                        if let Ok(mut v) = serde_json::from_slice::<Value>(&json) {
                            if usage::reconcile(prefill, &mut v, &self.route.usage) {
                                json = serde_json::to_vec(&v).unwrap_or_default();
                            }
                        }
                    }
                }
                lines.push([b"data: ".as_slice(), &json, b"\n"].concat());
            }
            if lines.is_empty() {
                continue;
            }
            if self.route.ends_stream(&lines.concat()) {
                self.saw_done = true;
            }
            lines.iter().for_each(|l| out.extend_from_slice(l));
            out.push(b'\n');
        }
        if out.is_empty() && self.halt.is_none() {
            return None;
        }
        Some(Bytes::from(out))
    }
}

impl App {
    pub fn new(cfg: Arc<Config>, reg: Arc<Registry>) -> Arc<Self> {
        let s = seed();
        Arc::new(Self {
            prefill_policy: Policy::new(cfg.prefill_policy, Role::Prefill, &cfg, s),
            decode_policy: Policy::new(cfg.decode_policy, Role::Decode, &cfg, s.rotate_left(17)),
            aggregated_policy: Policy::new(cfg.policy, Role::Aggregated, &cfg, s.rotate_left(31)),
            budget: RetryBudget::new(cfg.retry_budget_ratio, cfg.retry_budget_floor),
            draining: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            ids: AtomicU64::new(s),
            prompt_ids: PromptIds::new(cfg.prompt_ids_cap),
            created: SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_secs(),
            cfg,
            reg,
        })
    }

    pub fn ready(&self) -> (bool, Value) {
        if self.cfg.mode == Mode::PrefillDecode {
            let (p, d) = (self.reg.prefill.routable_count(), self.reg.decode.routable_count());
            (p > 0 && d > 0, json!({"prefill": p, "decode": d}))
        } else {
            let a = self.reg.aggregated.routable_count();
            (a > 0, json!({"engines": a}))
        }
    }

    fn models(&self) -> Value {
        json!({"id": self.cfg.served_model_name, "object": "model", "created": self.created, "owned_by": "kimik3"})
    }

    pub async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Response<Body> {
        let uri = req.uri();
        if uri.scheme().is_some() || uri.authority().is_some() {
            return reply::error(400, "invalid_request_error", "absolute-form request targets are not accepted");
        }
        let path = uri.path().to_string();
        let method = req.method().clone();
        if method == Method::POST {
            if let Some(route) = Route::find(&path) {
                return self.inference(req, route).await; // counts its own outcomes
            }
        }
        let resp = match (&method, path.as_str()) {
            (&Method::GET, "/health") | (&Method::GET, "/liveness") => {
                reply::json_response(200, &json!({"status": "ok"}))
            }
            (&Method::GET, "/readiness") => {
                let (ready, detail) = self.ready();
                let ready = ready && !self.draining.load(Ordering::Relaxed);
                reply::json_response(if ready { 200 } else { 503 }, &json!({"ready": ready, "routable": detail}))
            }
            (&Method::GET, "/v1/models") => {
                reply::json_response(200, &json!({"object": "list", "data": [self.models()]}))
            }
            (&Method::GET, p) if p.starts_with("/v1/models/") => {
                let id = percent_decode(p.trim_start_matches("/v1/models/"));
                if id == self.cfg.served_model_name {
                    reply::json_response(200, &self.models())
                } else {
                    let shown: String = id.chars().take(200).collect();
                    reply::error(404, "NotFoundError", &format!("The model `{shown}` does not exist."))
                }
            }
            // vLLM's stored-response routes: nothing is stored here (routes.rs, NOT_STORED).
            (&Method::GET | &Method::DELETE, p) if p.starts_with("/v1/responses/") => {
                reply::error(404, "NotFoundError", crate::routes::NOT_STORED)
            }
            (&Method::POST, p) if p.starts_with("/v1/responses/") && p.ends_with("/cancel") => {
                reply::error(404, "NotFoundError", crate::routes::NOT_STORED)
            }
            (&Method::POST, "/v1/messages") => reply::error(
                501,
                "not_implemented",
                "/v1/messages (the Anthropic API) is not supported through the prefill/decode hand-off; use /v1/chat/completions",
            ),
            _ => reply::error(404, "not_found", "no such route"),
        };
        let status = resp.status().as_u16();
        if status >= 400 {
            METRICS.inc(
                "kimik3_router_requests_total",
                &[("route", crate::metrics::OTHER_ROUTE), ("outcome", outcome_of(status))],
            );
        }
        resp
    }

    async fn read_body(&self, req: Request<Incoming>) -> Result<(HeaderMap, Bytes), Response<Body>> {
        let cap = self.cfg.max_payload_size;
        let too_large =
            || reply::error(413, "invalid_request_error", &format!("the request body is larger than {cap} bytes"));
        if let Some(len) = req.headers().get(http::header::CONTENT_LENGTH) {
            match len.to_str().ok().and_then(|s| s.parse::<u64>().ok()) {
                Some(n) if n > cap as u64 => return Err(too_large()),
                Some(_) => {}
                None => {
                    return Err(reply::error(400, "invalid_request_error", "bad Content-Length"));
                }
            }
        }
        let (parts, mut body) = req.into_parts();
        let mut deadline = tokio::time::Instant::now() + self.cfg.body_timeout;
        let mut collected = Vec::new();
        // Past the cap the rest is read and dropped (up to DRAIN_CAP more, for up to DRAIN_TIME)
        // before answering: closing a socket with unread bytes sends a reset, and the peer (the front)
        // may then lose the 413 it had not read yet.
        let mut seen: usize = 0;
        loop {
            let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
                Err(_) if seen > cap => break,
                Err(_) => {
                    return Err(reply::error(408, "invalid_request_error", "the request body did not arrive in time"));
                }
                Ok(None) => break,
                Ok(Some(Err(e))) => {
                    return Err(reply::error(400, "invalid_request_error", &format!("reading the request body: {e}")));
                }
                Ok(Some(Ok(frame))) => frame,
            };
            if let Ok(data) = frame.into_data() {
                seen = seen.saturating_add(data.len());
                if seen <= cap {
                    collected.extend_from_slice(&data);
                } else if seen > cap.saturating_add(DRAIN_CAP) {
                    break;
                } else if seen - data.len() <= cap {
                    collected = Vec::new();
                    deadline = deadline.min(tokio::time::Instant::now() + DRAIN_TIME);
                }
            }
        }
        if seen > cap {
            return Err(too_large());
        }
        Ok((parts.headers, Bytes::from(collected)))
    }

    async fn inference(self: Arc<Self>, req: Request<Incoming>, route: &'static Route) -> Response<Body> {
        let started = Instant::now();
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        METRICS.set("kimik3_router_in_flight_requests", &[], self.in_flight.load(Ordering::Relaxed) as f64);
        let in_flight = InFlight(self.clone(), started, route);
        let span = Arc::new(Span::server(req.headers(), format!("POST {}", route.path)));
        span.set("http.request.method", "POST");
        span.set("url.path", route.path);
        let resp = self.inference_inner(req, route, started, in_flight, span.clone()).await;
        let status = resp.status().as_u16();
        span.set("http.response.status_code", i64::from(status));
        if status != 200 {
            METRICS.inc("kimik3_router_requests_total", &[("route", route.label), ("outcome", outcome_of(status))]);
            if status >= 500 {
                span.fail(outcome_of(status));
            }
        }
        resp
    }

    async fn inference_inner(
        self: &Arc<Self>,
        req: Request<Incoming>,
        route: &'static Route,
        started: Instant,
        in_flight: InFlight,
        span: Arc<Span>,
    ) -> Response<Body> {
        if self.draining.load(Ordering::Relaxed) {
            return reply::error(503, "service_unavailable", "the router is shutting down");
        }
        let (headers, bytes) = match self.read_body(req).await {
            Ok(x) => x,
            Err(resp) => return resp,
        };
        let body_in = Instant::now();
        let mut body = match serde_json::from_slice::<Value>(&bytes) {
            Ok(Value::Object(m)) => m,
            Ok(_) => {
                return reply::error(400, "invalid_request_error", "the request body must be a JSON object");
            }
            Err(e) => {
                return reply::error(400, "invalid_request_error", &format!("the request body is not valid JSON: {e}"));
            }
        };
        if let Some(model) = body.get("model").and_then(Value::as_str) {
            if model != self.cfg.served_model_name {
                let shown: String = model.chars().take(200).collect();
                let mut resp = reply::error(404, "NotFoundError", &format!("The model `{shown}` does not exist."));
                if let Some(v) = headers.get("x-request-id") {
                    resp.headers_mut().insert("x-request-id", v.clone());
                }
                return resp;
            }
        }
        if let Some(message) = (route.refuse)(&body) {
            return reply::error(400, "invalid_request_error", message);
        }
        // Only the router hands KV over: a client's own kv_transfer_params never reach an engine.
        body.remove("kv_transfer_params");
        route.force(&mut body);
        self.budget.record_request();
        let stream = body.get("stream").and_then(Value::as_bool).unwrap_or(false);
        let prefix = route.prefix(&body);
        let estimate = bytes.len() as f64 / 4.0;
        let first_token =
            self.cfg.first_token_timeout + Duration::from_secs_f64(estimate / self.cfg.prefill_tokens_per_sec);
        let whole_answer = route
            .max_tokens(&body)
            .map(|n| self.cfg.idle_gap_timeout.saturating_mul(u32::try_from(n).unwrap_or(u32::MAX)));
        let random = self.ids.fetch_add(0x9e3779b97f4a7c15, Ordering::Relaxed);
        // A stream that may move mid-way asks its legs for token ids (migrate.rs).
        let resume = stream.then(|| match (self.cfg.max_migrations, refusal(route, &body)) {
            (0, _) => Err("off"),
            (_, Some(why)) => Err(why),
            (_, None) => {
                let r = Resume::new(route, &body);
                body.insert("return_token_ids".into(), Value::Bool(true));
                Ok(r)
            }
        });
        // A stream that may move asks its engines for the prompt's ids: they come back with it.
        let learns_ids = matches!(resume, Some(Ok(_)));
        let keys = if self.precise().is_some() && route.label == "chat_completions" {
            crate::prompt_ids::keys(&body)
        } else {
            Vec::new()
        };
        let ctx = Arc::new(Ctx {
            route,
            session: session_key(&headers, &body),
            body,
            stream,
            client_request_id: headers.get("x-request-id").cloned(),
            span,
            base_id: format!("{:016x}", crate::policy::fnv(&random.to_le_bytes())),
            started,
            body_in,
            deadline: started + self.cfg.request_timeout,
            first_token,
            whole_answer,
            prefix,
            sent_first: AtomicBool::new(false),
            resume: Mutex::new(resume),
            avoid: Vec::new(),
            ids: std::sync::OnceLock::new(),
            ids_source: std::sync::OnceLock::new(),
            keys,
        });
        let mut resp = match self.serve(&ctx).await {
            Served::Done(resp) => resp,
            Served::Stream(up) => self.relay(&ctx, up, in_flight),
        };
        if ctx.ids_source.get() == Some(&"continued") && !learns_ids {
            self.refresh_prompt_ids(&ctx);
        }
        if let Some(v) = &ctx.client_request_id {
            resp.headers_mut().insert("x-request-id", v.clone());
        }
        resp
    }

    /// The role whose engines precise_prefix picks (the first leg's), if it is the policy there.
    fn precise(&self) -> Option<Role> {
        let role = if self.cfg.mode == Mode::PrefillDecode { Role::Prefill } else { Role::Aggregated };
        let policy = if role == Role::Prefill { &self.prefill_policy } else { &self.aggregated_policy };
        (policy.kind == PolicyKind::PrecisePrefix).then_some(role)
    }

    async fn serve(&self, ctx: &Ctx) -> Served {
        if let Some(role) = self.precise() {
            if ctx.ids.get().is_none() {
                let (ids, source) = self.token_ids(ctx, role).await;
                METRICS.inc("kimik3_router_token_ids_total", &[("source", source)]);
                let _ = ctx.ids_source.set(source);
                let _ = ctx.ids.set(ids);
            }
        }
        match self.cfg.mode {
            Mode::PrefillDecode => self.pd(ctx).await,
            Mode::Aggregated => self.aggregated(ctx).await,
        }
    }

    /// The client's stream from an engine's: relayed by RelayBody.
    fn relay(self: &Arc<Self>, ctx: &Arc<Ctx>, up: Upstream, in_flight: InFlight) -> Response<Body> {
        let (resume, refused) = match ctx.resume.lock().ok().and_then(|mut r| r.take()) {
            Some(Ok(r)) => (Some(r), None),
            Some(Err(why)) => (None, Some(why)),
            None => (None, Some("off")),
        };
        let content_type = up.content_type.clone();
        let first = Some((up.first.clone(), up.arrived));
        let sse = SseRelay::new(ctx.route, up.prefill.clone(), resume);
        let relay = RelayBody {
            leg: up,
            app: self.clone(),
            ctx: ctx.clone(),
            route: ctx.route,
            sse,
            refused,
            first,
            moving: None,
            idle: Box::pin(tokio::time::sleep(self.cfg.idle_gap_timeout)),
            deadline: Box::pin(sleep_until(ctx.deadline.into())),
            idle_armed: false,
            done: false,
            _in_flight: in_flight,
        };
        let mut resp = Response::new(BodyExt::boxed(relay));
        resp.headers_mut().insert(http::header::CONTENT_TYPE, content_type);
        resp.headers_mut().insert(http::header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        resp
    }

    /// The request a moving stream goes on with (migrate.rs): a leg set like the first one's, on
    /// the continuation's route and body, under the same span and deadline.
    async fn continue_stream(
        self: Arc<Self>,
        ctx: Arc<Ctx>,
        next: Continuation,
        n: u32,
        failed: Vec<u64>,
    ) -> Result<Upstream, Failure> {
        let mut next = next;
        let ids = next.body.get("prompt").and_then(Value::as_array).map_or(0, Vec::len);
        if next.needs_room {
            let room = self.room(ids).await.ok_or_else(|| {
                Failure::Sent("failed", "no engine said its max_model_len: the continuation's cap is unknown".into())
            })?;
            next.body.insert("max_tokens".into(), room.into());
        }
        let first_token =
            self.cfg.first_token_timeout + Duration::from_secs_f64(ids as f64 / self.cfg.prefill_tokens_per_sec);
        let moved = Ctx {
            route: next.route,
            body: next.body,
            stream: true,
            client_request_id: ctx.client_request_id.clone(),
            span: ctx.span.clone(),
            base_id: format!("{}-m{n}", ctx.base_id),
            started: Instant::now(),
            body_in: Instant::now(),
            deadline: ctx.deadline,
            first_token,
            whole_answer: None,
            session: ctx.session.clone(),
            prefix: ctx.prefix.clone(),
            sent_first: AtomicBool::new(true),
            resume: Mutex::new(None),
            avoid: failed,
            ids: std::sync::OnceLock::new(),
            ids_source: std::sync::OnceLock::new(),
            keys: Vec::new(),
        };
        match self.serve(&moved).await {
            Served::Stream(up) => Ok(up),
            Served::Done(resp) => Err(Failure::Sent(
                "failed",
                format!("the continuation was answered {} instead of a stream", resp.status().as_u16()),
            )),
        }
    }

    /// max_model_len minus `prompt` tokens, from a routable engine's /v1/models (vLLM's model card
    /// carries max_model_len): the cap a chat request without one has. None if no engine says, or
    /// there is no room left.
    async fn room(&self, prompt: usize) -> Option<u64> {
        let roles: &[Role] =
            if self.cfg.mode == Mode::PrefillDecode { &[Role::Prefill, Role::Decode] } else { &[Role::Aggregated] };
        let mut engines: Vec<String> = Vec::new();
        for role in roles {
            for w in self.reg.pool(*role).snapshot().iter().filter(|w| w.routable()) {
                if !engines.contains(&w.endpoint.authority) {
                    engines.push(w.endpoint.authority.clone());
                }
            }
        }
        // The first engine that answers (the one whose stream just failed may be among them).
        for engine in engines.iter().take(4) {
            let Ok((200, body)) = upstream::get(engine, "/v1/models", self.cfg.health_timeout).await else {
                continue;
            };
            let max = serde_json::from_slice::<Value>(&body)
                .ok()
                .and_then(|v| v.pointer("/data/0/max_model_len").and_then(Value::as_u64));
            if let Some(max) = max {
                return max.checked_sub(prompt as u64).filter(|n| *n > 0);
            }
        }
        None
    }

    /// A prompt's token ids for precise_prefix, and where they came from (docs/kv-events.md): a
    /// completions prompt of ids as given (`body`); a chat that continues one the router has seen, the
    /// earlier prompt's ids less its generation prompt (`continued`: a prefix, which bounds the hit it
    /// can find, without asking anyone); else the least loaded routable engine of `role` answers
    /// /tokenize within the budget (`tokenize`); None when none of these works (`none`: routed by text).
    async fn token_ids(&self, ctx: &Ctx, role: Role) -> (Option<Vec<u64>>, &'static str) {
        let chat = ctx.route.label == "chat_completions";
        if !chat {
            let Some(prompt) = ctx.body.get("prompt") else { return (None, "none") };
            let one = match prompt.as_array().map(Vec::as_slice) {
                Some([Value::Array(inner)]) => Some(inner.as_slice()),
                Some(items) if items.iter().all(Value::is_u64) => Some(items),
                _ => None,
            };
            if let Some(items) = one {
                return (items.iter().map(Value::as_u64).collect(), "body");
            }
        }
        if ctx.route.label != "completions" && !chat {
            return (None, "none");
        }
        if let Some(prefix) = self.prompt_ids.prefix(&ctx.keys) {
            return (Some(prefix), "continued");
        }
        let started = Instant::now();
        let ask = Self::tokenize_body(&ctx.body, chat);
        let ids = tokio::time::timeout(self.tokenize_budget(ctx), self.tokenize(ask, role)).await.ok().flatten();
        METRICS.added_tokenize.observe(started.elapsed());
        match ids {
            Some(ids) => {
                self.prompt_ids.store(&ctx.keys, &ids);
                (Some(ids), "tokenize")
            }
            None => (None, "none"),
        }
    }

    /// How long precise_prefix may wait for /tokenize: --tokenize-timeout-ms, or 5% of the prompt's
    /// predicted prefill (body bytes / 4 at --prefill-tokens-per-sec) when that is longer: a long
    /// prompt gains the most from a hit and takes longer to tokenize.
    fn tokenize_budget(&self, ctx: &Ctx) -> Duration {
        let predicted = ctx.first_token.saturating_sub(self.cfg.first_token_timeout);
        self.cfg.tokenize_timeout.max(predicted / 20)
    }

    /// What /tokenize is asked for a request's prompt: its prompt, or its messages and what the
    /// chat template renders beside them.
    fn tokenize_body(body: &Map<String, Value>, chat: bool) -> Map<String, Value> {
        let keys: &[&str] = if chat {
            &["model", "messages", "tools", "chat_template_kwargs", "add_generation_prompt", "continue_final_message"]
        } else {
            &["model", "prompt"]
        };
        keys.iter().filter_map(|k| body.get(*k).map(|v| ((*k).to_string(), v.clone()))).collect()
    }

    /// `ask` (tokenize_body), tokenized by the least loaded routable engine of `role`.
    async fn tokenize(&self, ask: Map<String, Value>, role: Role) -> Option<Vec<u64>> {
        let pool = self.reg.pool(role).snapshot();
        let worker = pool.iter().filter(|w| w.routable()).min_by_key(|w| w.load.load(Ordering::Relaxed))?;
        let engine = worker.endpoint.authority.clone();
        let body = Bytes::from(serde_json::to_vec(&Value::Object(ask)).unwrap_or_default());
        let req = Request::post("/tokenize")
            .header(http::header::HOST, engine.as_str())
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(body))
            .ok()?;
        let resp = upstream::send(&engine, req, self.cfg.connect_timeout).await.ok()?;
        if !resp.status().is_success() {
            return None;
        }
        let bytes = upstream::read_body(resp.into_body(), ANSWER_CAP).await.ok()?;
        let v: Value = serde_json::from_slice(&bytes).ok()?;
        v.get("tokens")?.as_array()?.iter().map(Value::as_u64).collect::<Option<Vec<u64>>>()
    }

    /// A continued chat whose engine will not say what its prompt's ids are (a whole answer, or a
    /// stream that may not move): an engine tokenizes it after the request went, off its path, so
    /// the next turn continues from this one and not from an older one.
    fn refresh_prompt_ids(self: &Arc<Self>, ctx: &Ctx) {
        let (Some(role), app) = (self.precise(), self.clone()) else { return };
        let (ask, keys) = (Self::tokenize_body(&ctx.body, true), ctx.keys.clone());
        tokio::spawn(async move {
            if let Ok(Some(ids)) = tokio::time::timeout(Duration::from_secs(10), app.tokenize(ask, role)).await {
                METRICS.inc("kimik3_router_token_ids_total", &[("source", "refreshed")]);
                app.prompt_ids.store(&keys, &ids);
            }
        });
    }

    /// A stream's engine said what its prompt's ids are: kept for the chats that continue it, and
    /// checked against the prefix the request was routed with, if it was a continuation.
    fn learned_prompt_ids(&self, ctx: &Ctx, ids: &[u64]) {
        if ctx.keys.is_empty() {
            return;
        }
        if ctx.ids_source.get() == Some(&"continued") {
            if let Some(Some(prefix)) = ctx.ids.get() {
                self.prompt_ids.check(prefix, ids);
            }
        }
        self.prompt_ids.store(&ctx.keys, ids);
    }

    fn candidates(&self, role: Role, tried: &[u64]) -> (Arc<Vec<Arc<Worker>>>, Vec<Arc<Worker>>) {
        let all = self.reg.pool(role).snapshot();
        let c = all.iter().filter(|w| w.routable() && !tried.contains(&w.id)).cloned().collect();
        (all, c)
    }

    fn pick(&self, role: Role, ctx: &Ctx, tried: &[u64]) -> Option<Arc<Worker>> {
        let (all, candidates) = self.candidates(role, tried);
        let policy = match role {
            Role::Prefill => &self.prefill_policy,
            Role::Decode => &self.decode_policy,
            Role::Aggregated => &self.aggregated_policy,
        };
        let ids = ctx.ids.get().and_then(Option::as_deref);
        let kv = Some(self.reg.kv.as_ref());
        let input = RouteInput { session: ctx.session.as_deref(), prefix: &ctx.prefix, ids, kv };
        policy.select(&all, &candidates, &input)
    }

    fn has_candidate(&self, role: Role, tried: &[u64]) -> bool {
        self.reg.pool(role).snapshot().iter().any(|w| w.routable() && !tried.contains(&w.id))
    }

    /// A retry is taken only if there is somewhere to send it, --max-retries allows it and the
    /// retry budget has room.
    fn may_retry(&self, retries: &mut u32, kind: &'static str) -> bool {
        debug_assert!(crate::metrics::RETRY_KINDS.contains(&kind), "a retry kind not in RETRY_KINDS: {kind}");
        if *retries >= self.cfg.max_retries {
            return false;
        }
        if !self.budget.try_retry() {
            METRICS.inc("kimik3_router_retry_budget_exhausted_total", &[]);
            crate::warn!("retry budget spent: not retrying ({kind})");
            return false;
        }
        *retries += 1;
        METRICS.inc("kimik3_router_retries_total", &[("kind", kind)]);
        true
    }

    fn leg_request(
        &self,
        ctx: &Ctx,
        w: &Worker,
        body: Bytes,
        leg_id: &str,
        span: &Span,
    ) -> Option<Request<Full<Bytes>>> {
        let mut b = Request::post(ctx.route.path)
            .header(http::header::HOST, w.endpoint.authority.as_str())
            .header(http::header::CONTENT_TYPE, "application/json")
            .header("x-request-id", leg_id);
        if let Some(rank) = w.rank {
            b = b.header("X-data-parallel-rank", rank.to_string());
        }
        for (name, value) in span.headers() {
            b = b.header(name, value);
        }
        b.body(Full::new(body)).ok()
    }

    /// A leg's CLIENT span under the request's: what its traceparent names to the engine.
    fn leg_span(ctx: &Ctx, w: &Worker, leg_id: &str) -> Arc<Span> {
        let span = ctx.span.child(w.endpoint.role.name(), Kind::Client);
        span.set("kimik3.role", w.endpoint.role.name());
        span.set("server.address", w.endpoint.authority.as_str());
        span.set("k8s.pod.name", w.endpoint.pod.as_deref().unwrap_or("-"));
        span.set("kimik3.leg_id", leg_id);
        if let Some(rank) = w.rank {
            span.set("kimik3.dp_rank", i64::from(rank));
        }
        Arc::new(span)
    }

    fn leg_done(&self, w: &Worker, outcome: &str) {
        METRICS.inc(
            "kimik3_router_leg_requests_total",
            &[("role", w.endpoint.role.name()), ("engine", &w.endpoint.authority), ("outcome", outcome)],
        );
    }

    fn fail(&self, w: &Worker, f: &Failure) {
        crate::info!(
            "{} leg on {} (pod {}) failed ({}): {}",
            w.endpoint.role.name(),
            w.label,
            w.endpoint.pod.as_deref().unwrap_or("-"),
            f.outcome(),
            match f {
                Failure::NotTaken(m) | Failure::Sent(_, m) | Failure::Timeout(_, m) => m,
            }
        );
        self.leg_done(w, f.outcome());
        w.endpoint.record_failure(&self.cfg);
        self.reg.pool(w.endpoint.role).publish_count();
    }

    /// Connect and send one leg; the answer's head by the watchdog's `until` (or the engine dies
    /// first). Its `Late` names the failure of a head that comes after it and before the request deadline.
    async fn send_leg(
        &self,
        ctx: &Ctx,
        w: &Arc<Worker>,
        body: Bytes,
        (leg_id, span): (&str, &Span),
        (until, late): (Instant, Late),
        down: &mut watch::Receiver<bool>,
    ) -> Result<Response<Incoming>, Failure> {
        let req = self
            .leg_request(ctx, w, body, leg_id, span)
            .ok_or_else(|| Failure::Sent("failed", "bad request head".into()))?;
        let stream = match upstream::connect(&w.endpoint.authority, self.cfg.connect_timeout).await {
            Ok(s) => s,
            Err(e) => return Err(Failure::NotTaken(e.message().to_string())),
        };
        if !ctx.sent_first.swap(true, Ordering::Relaxed) {
            METRICS.added_request.observe(ctx.started.elapsed());
            METRICS.added_body.observe(ctx.body_in.elapsed());
        }
        match guarded(upstream::send_on(stream, req), until, down).await {
            Ok(Ok(resp)) => Ok(resp),
            Ok(Err(SendError::Connect(m))) => Err(Failure::NotTaken(m)),
            Ok(Err(SendError::Failed(m))) => Err(Failure::Sent("failed", m)),
            Err(Stop::Deadline) if until >= ctx.deadline => {
                Err(Failure::Timeout("timeout", "the request timed out".into()))
            }
            Err(Stop::Deadline) => Err(Failure::Timeout(late.0, late.1.into())),
            Err(Stop::Down) => {
                Err(Failure::Sent("engine_down", "the engine stopped answering its health probes".into()))
            }
        }
    }

    fn passthrough(status: StatusCode, headers: &HeaderMap, body: Bytes) -> Response<Body> {
        let mut resp = Response::new(reply::full(body));
        *resp.status_mut() = status;
        if let Some(ct) = headers.get(http::header::CONTENT_TYPE) {
            resp.headers_mut().insert(http::header::CONTENT_TYPE, ct.clone());
        }
        resp
    }

    /// The prefill leg: Ok(its JSON answer) or the client's answer (a 4xx passed on) or a failure.
    async fn prefill_leg(
        &self,
        ctx: &Ctx,
        w: &Arc<Worker>,
        body: Bytes,
        leg_id: &str,
    ) -> Result<Result<Value, Response<Body>>, Failure> {
        let span = Self::leg_span(ctx, w, leg_id);
        let out = self.prefill_exchange(ctx, w, body, (leg_id, &span)).await;
        match &out {
            Ok(Ok(_)) => span.set("kimik3.outcome", "ok"),
            Ok(Err(resp)) => {
                span.set("kimik3.outcome", "client_error");
                span.set("http.response.status_code", i64::from(resp.status().as_u16()));
            }
            Err(f) => f.mark(&span),
        }
        out
    }

    async fn prefill_exchange(
        &self,
        ctx: &Ctx,
        w: &Arc<Worker>,
        body: Bytes,
        leg: (&str, &Span),
    ) -> Result<Result<Value, Response<Body>>, Failure> {
        let _load = LoadGuard::new(w);
        let mut down = w.endpoint.down_signal();
        let until = (Instant::now() + ctx.first_token).min(ctx.deadline);
        let resp = self.send_leg(ctx, w, body, leg, (until, FIRST_TOKEN_LATE), &mut down).await?;
        let (parts, incoming) = resp.into_parts();
        let bytes = match guarded(upstream::read_body(incoming, ANSWER_CAP), until, &mut down).await {
            Ok(Ok(b)) => b,
            Ok(Err(m)) => return Err(Failure::Sent("failed", m)),
            Err(Stop::Deadline) => {
                return Err(Failure::Timeout("first_token_timeout", "the prefill did not answer in time".into()));
            }
            Err(Stop::Down) => {
                return Err(Failure::Sent("engine_down", "the prefill stopped answering its health probes".into()));
            }
        };
        if parts.status.is_client_error() {
            self.leg_done(w, "client_error");
            w.endpoint.record_success();
            return Ok(Err(Self::passthrough(parts.status, &parts.headers, bytes)));
        }
        if !parts.status.is_success() {
            return Err(Failure::Sent("http_5xx", format!("prefill answered {}", parts.status.as_u16())));
        }
        match serde_json::from_slice::<Value>(&bytes) {
            Ok(v) if v.is_object() => {
                self.leg_done(w, "ok");
                w.endpoint.record_success();
                Ok(Ok(v))
            }
            _ => Err(Failure::Sent("failed", "the prefill's answer is not a JSON object".into())),
        }
    }

    /// A decode leg (or an aggregated engine's): the client's answer, or a failure before any byte
    /// of it was relayed. A stream's relay holds the leg's span: it ends with the stream.
    async fn answer_leg(&self, ctx: &Ctx, w: &Arc<Worker>, body: Bytes, leg_id: &str, prefill: Option<Value>) -> Leg {
        let span = Self::leg_span(ctx, w, leg_id);
        let out = self.answer_exchange(ctx, w, body, (leg_id, &span), prefill).await;
        match &out {
            Leg::Answer(resp) => span.set("http.response.status_code", i64::from(resp.status().as_u16())),
            Leg::Stream(_) => span.set("http.response.status_code", 200i64),
            Leg::Failed(f) => f.mark(&span),
        }
        out
    }

    async fn answer_exchange(
        &self,
        ctx: &Ctx,
        w: &Arc<Worker>,
        body: Bytes,
        (leg_id, span): (&str, &Arc<Span>),
        prefill: Option<Value>,
    ) -> Leg {
        let load = LoadGuard::new(w);
        let mut down = w.endpoint.down_signal();
        let first_until = (Instant::now() + ctx.first_token).min(ctx.deadline);
        // vLLM sends a whole answer's head with its body, at the end: its watchdog is one deadline.
        let until = match (ctx.stream, ctx.whole_answer) {
            (true, _) => first_until,
            (false, Some(allowance)) => first_until.checked_add(allowance).unwrap_or(ctx.deadline).min(ctx.deadline),
            (false, None) => ctx.deadline,
        };
        let late = if ctx.stream { FIRST_TOKEN_LATE } else { WHOLE_ANSWER_LATE };
        let resp = match self.send_leg(ctx, w, body, (leg_id, span), (until, late), &mut down).await {
            Ok(r) => r,
            Err(f) => return Leg::Failed(f),
        };
        let (parts, mut incoming) = resp.into_parts();
        if !parts.status.is_success() {
            let bytes = match guarded(upstream::read_body(incoming, 1 << 20), until, &mut down).await {
                Ok(Ok(b)) => b,
                _ => Bytes::new(),
            };
            if parts.status.is_client_error() {
                self.leg_done(w, "client_error");
                w.endpoint.record_success();
                return Leg::Answer(Self::passthrough(parts.status, &parts.headers, bytes));
            }
            return Leg::Failed(Failure::Sent("http_5xx", format!("engine answered {}", parts.status.as_u16())));
        }
        if !ctx.stream {
            let bytes = match guarded(upstream::read_body(incoming, ANSWER_CAP), until, &mut down).await {
                Ok(Ok(b)) => b,
                Ok(Err(m)) => return Leg::Failed(Failure::Sent("failed", m)),
                Err(Stop::Deadline) if until >= ctx.deadline => {
                    return Leg::Failed(Failure::Timeout("timeout", "the request timed out".into()));
                }
                Err(Stop::Deadline) => {
                    return Leg::Failed(Failure::Timeout(WHOLE_ANSWER_LATE.0, WHOLE_ANSWER_LATE.1.into()));
                }
                Err(Stop::Down) => {
                    return Leg::Failed(Failure::Sent(
                        "engine_down",
                        "the engine stopped answering its health probes".into(),
                    ));
                }
            };
            self.leg_done(w, "ok");
            w.endpoint.record_success();
            METRICS.inc("kimik3_router_requests_total", &[("route", ctx.route.label), ("outcome", "ok")]);
            let out = match (prefill, serde_json::from_slice::<Value>(&bytes)) {
                (Some(p), Ok(mut v)) => {
                    usage::reconcile(&p, &mut v, &ctx.route.usage);
                    usage::merge_logprobs(&p, &mut v);
                    Bytes::from(serde_json::to_vec(&v).unwrap_or_default())
                }
                _ => bytes,
            };
            return Leg::Answer(Self::passthrough(parts.status, &parts.headers, out));
        }
        // A stream: nothing is committed until its first chunk is here.
        let first = match guarded(next_data(&mut incoming), first_until, &mut down).await {
            Ok(Ok(Some(b))) => b,
            Ok(Ok(None)) => {
                return Leg::Failed(Failure::Sent("failed", "the stream ended before its first chunk".into()));
            }
            Ok(Err(m)) => return Leg::Failed(Failure::Sent("failed", m)),
            Err(Stop::Deadline) if first_until >= ctx.deadline => {
                return Leg::Failed(Failure::Timeout("timeout", "the request timed out".into()));
            }
            Err(Stop::Deadline) => {
                return Leg::Failed(Failure::Timeout("first_token_timeout", "no first token in time".into()));
            }
            Err(Stop::Down) => {
                return Leg::Failed(Failure::Sent(
                    "engine_down",
                    "the engine stopped answering its health probes".into(),
                ));
            }
        };
        let content_type = parts
            .headers
            .get(http::header::CONTENT_TYPE)
            .cloned()
            .unwrap_or(HeaderValue::from_static("text/event-stream"));
        Leg::Stream(Upstream {
            first,
            arrived: Instant::now(),
            incoming,
            worker: w.clone(),
            _load: load,
            span: span.clone(),
            prefill,
            content_type,
        })
    }

    /// The client's body with the prefill's overrides, serialized without a deep copy of it (a prompt
    /// can be megabytes): a map of references in the same key order as the body's own.
    fn prefill_body(ctx: &Ctx) -> Bytes {
        let one = json!(1);
        let no = json!(false);
        let params = json!({"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": null,
                            "remote_block_ids": null, "remote_host": null, "remote_port": null});
        let mut b: std::collections::BTreeMap<&str, &Value> =
            ctx.body.iter().filter(|(k, _)| k.as_str() != "stream_options").map(|(k, v)| (k.as_str(), v)).collect();
        for key in ctx.route.max_tokens.iter().chain([&ctx.route.prefill_cap]) {
            if *key == ctx.route.prefill_cap || b.contains_key(key) {
                b.insert(key, &one);
            }
        }
        // vLLM hands KV over only for a request stopped by its length: no EOS on the one token.
        let (stop_key, stop_value) = ctx.route.one_token.field();
        b.insert(stop_key, &stop_value);
        b.insert("stream", &no);
        b.insert("kv_transfer_params", &params);
        Bytes::from(serde_json::to_vec(&b).unwrap_or_default())
    }

    fn no_engine(&self, role: Role) -> Response<Body> {
        reply::error(503, "service_unavailable", &format!("no healthy {} engine", role.name()))
    }

    fn failed(f: &Failure) -> Response<Body> {
        let (status, kind, message) = f.client_error();
        reply::error(status, kind, &message)
    }

    async fn pd(&self, ctx: &Ctx) -> Served {
        let prefill_body = Self::prefill_body(ctx);
        let (mut tried_p, mut tried_d) = (Vec::new(), ctx.avoid.clone());
        let mut retries = 0;
        let mut last: Option<Failure> = None;
        let mut attempt = 0;
        'pair: loop {
            attempt += 1;
            let (Some(p), Some(mut d)) =
                (self.pick(Role::Prefill, ctx, &tried_p), self.pick(Role::Decode, ctx, &tried_d))
            else {
                return Served::Done(match &last {
                    Some(f) => Self::failed(f),
                    None if self.reg.prefill.routable_count() == 0 => self.no_engine(Role::Prefill),
                    None => self.no_engine(Role::Decode),
                });
            };
            let leg = format!("{}-p{attempt}", ctx.base_id);
            let prefill = match self.prefill_leg(ctx, &p, prefill_body.clone(), &leg).await {
                Ok(Ok(v)) => v,
                Ok(Err(client_error)) => return Served::Done(client_error),
                Err(f) => {
                    self.fail(&p, &f);
                    tried_p.push(p.id);
                    last = Some(f);
                    if self.has_candidate(Role::Prefill, &tried_p) && self.may_retry(&mut retries, "prefill") {
                        continue 'pair;
                    }
                    return Served::Done(
                        last.as_ref().map(Self::failed).unwrap_or_else(|| self.no_engine(Role::Prefill)),
                    );
                }
            };
            let mut decode_body = ctx.body.clone();
            if let Some(params) = prefill.get("kv_transfer_params").filter(|v| v.is_object()) {
                decode_body.insert("kv_transfer_params".into(), params.clone());
            } else {
                crate::debug!("prefill {} returned no kv_transfer_params: the decode prefills itself", p.label);
            }
            let decode_bytes = Bytes::from(serde_json::to_vec(&Value::Object(decode_body)).unwrap_or_default());
            let mut resend = 0;
            loop {
                resend += 1;
                let leg = format!("{}-d{attempt}.{resend}", ctx.base_id);
                match self.answer_leg(ctx, &d, decode_bytes.clone(), &leg, Some(prefill.clone())).await {
                    Leg::Answer(resp) => return Served::Done(resp),
                    Leg::Stream(up) => return Served::Stream(up),
                    Leg::Failed(f) => {
                        self.fail(&d, &f);
                        tried_d.push(d.id);
                        let not_taken = matches!(f, Failure::NotTaken(_));
                        last = Some(f);
                        if not_taken {
                            // The decode never saw these params: another decode may have them.
                            if self.has_candidate(Role::Decode, &tried_d) {
                                if self.may_retry(&mut retries, "decode_same_params") {
                                    if let Some(next) = self.pick(Role::Decode, ctx, &tried_d) {
                                        d = next;
                                        continue;
                                    }
                                }
                                return Served::Done(
                                    last.as_ref().map(Self::failed).unwrap_or_else(|| self.no_engine(Role::Decode)),
                                );
                            }
                        }
                        // The params may have been read: burn them, prefill again.
                        if self.has_candidate(Role::Decode, &tried_d) && self.may_retry(&mut retries, "reprefill") {
                            continue 'pair;
                        }
                        return Served::Done(
                            last.as_ref().map(Self::failed).unwrap_or_else(|| self.no_engine(Role::Decode)),
                        );
                    }
                }
            }
        }
    }

    async fn aggregated(&self, ctx: &Ctx) -> Served {
        let body = Bytes::from(serde_json::to_vec(&Value::Object(ctx.body.clone())).unwrap_or_default());
        let mut tried = ctx.avoid.clone();
        let mut retries = 0;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let Some(w) = self.pick(Role::Aggregated, ctx, &tried) else {
                return Served::Done(self.no_engine(Role::Aggregated));
            };
            let leg = format!("{}-a{attempt}", ctx.base_id);
            match self.answer_leg(ctx, &w, body.clone(), &leg, None).await {
                Leg::Answer(resp) => return Served::Done(resp),
                Leg::Stream(up) => return Served::Stream(up),
                Leg::Failed(f) => {
                    self.fail(&w, &f);
                    tried.push(w.id);
                    if !self.has_candidate(Role::Aggregated, &tried) || !self.may_retry(&mut retries, "aggregated") {
                        return Served::Done(Self::failed(&f));
                    }
                }
            }
        }
    }
}

type Moving = Pin<Box<dyn Future<Output = Result<Upstream, Failure>> + Send>>;

/// The client's stream: the engine's, relayed as the client's connection asks for it (no task and
/// no channel between them: a chunk costs one wake-up, not two), with the idle-gap and request
/// watchdogs. When the engine fails mid-way the stream moves to another engine (migrate.rs) if it
/// may, else it ends with an SSE error event. Dropped when the client leaves, which drops the
/// engine's connection and so aborts its request.
struct RelayBody {
    /// The engine's stream, its worker, load and leg span. First: fields drop in order, and the
    /// leg's span must end before the request's (ctx.span), which ends when the last Ctx goes.
    leg: Upstream,
    app: Arc<App>,
    ctx: Arc<Ctx>,
    route: &'static Route,
    sse: SseRelay,
    /// Why the stream cannot move (None: it may, while sse.resume allows it).
    refused: Option<&'static str>,
    /// The first chunk, read before the answer was committed, and when it arrived.
    first: Option<(Bytes, Instant)>,
    /// The continuation being set up after the engine failed (in a Mutex only to make the body
    /// Sync, as hyper's boxed body asks: it is polled through get_mut, never locked).
    moving: Option<Mutex<Moving>>,
    idle: Pin<Box<Sleep>>,
    deadline: Pin<Box<Sleep>>,
    /// The idle gap is timed from when the client asks for the next chunk, not from the last one:
    /// a slow client is not a stalled engine.
    idle_armed: bool,
    done: bool,
    _in_flight: InFlight,
}

/// A stream the client left (the relay dropped before its end): its spans say so.
impl Drop for RelayBody {
    fn drop(&mut self) {
        if !self.done {
            for span in [&self.leg.span, &self.ctx.span] {
                span.set("kimik3.outcome", "client_gone");
            }
        }
    }
}

impl RelayBody {
    fn leg_outcome(&self, outcome: &str) {
        let w = &self.leg.worker;
        METRICS.inc(
            "kimik3_router_leg_requests_total",
            &[("role", w.endpoint.role.name()), ("engine", &w.endpoint.authority), ("outcome", outcome)],
        );
    }

    /// The engine failed mid-stream: its failure recorded, and the stream moved if it may (Ok), else
    /// the reason it cannot.
    fn engine_failed(&mut self, reason: &'static str, message: &str) -> Result<(), &'static str> {
        self.leg_outcome(reason);
        let w = self.leg.worker.clone();
        crate::info!("stream from {} failed ({reason}): {message}", w.label);
        w.endpoint.record_failure(&self.app.cfg);
        self.app.reg.pool(w.endpoint.role).publish_count();
        self.leg.span.set("kimik3.outcome", reason);
        self.leg.span.fail(message);
        let why = self.move_on();
        METRICS.inc("kimik3_router_migrations_total", &[("outcome", why.err().unwrap_or("moved"))]);
        why
    }

    fn move_on(&mut self) -> Result<(), &'static str> {
        if let Some(why) = self.refused {
            return Err(why);
        }
        let Some(resume) = self.sse.resume.as_mut() else {
            return Err("off");
        };
        if resume.finished {
            return Err("finished");
        }
        if resume.migrations >= self.app.cfg.max_migrations {
            return Err("limit");
        }
        if let Some(why) = resume.blocked() {
            return Err(why);
        }
        let Some(next) = resume.continuation(self.route, &self.ctx.body) else {
            return Err("cap_spent");
        };
        if !self.app.budget.try_retry() {
            METRICS.inc("kimik3_router_retry_budget_exhausted_total", &[]);
            return Err("retry_budget");
        }
        resume.migrations += 1;
        let n = resume.migrations;
        crate::info!("moving a stream after {} tokens (migration {n})", resume.generated());
        METRICS.inc("kimik3_router_retries_total", &[("kind", "migration")]);
        self.ctx.span.set("kimik3.migrations", i64::from(n));
        self.sse.buf.clear(); // a partial event of the failed stream: never shown, its tokens not counted
        // Every rank of the failed engine: they share its process.
        let w = &self.leg.worker;
        let pool = self.app.reg.pool(w.endpoint.role).snapshot();
        let failed = pool.iter().filter(|o| o.endpoint.authority == w.endpoint.authority).map(|o| o.id).collect();
        self.moving = Some(Mutex::new(Box::pin(self.app.clone().continue_stream(self.ctx.clone(), next, n, failed))));
        Ok(())
    }

    fn cut(&mut self, reason: &'static str, status: u16, kind: &str, message: &str) -> Bytes {
        debug_assert!(crate::metrics::CUT_REASONS.contains(&reason), "a cut reason not in CUT_REASONS: {reason}");
        METRICS.inc("kimik3_router_streams_cut_total", &[("reason", reason)]);
        METRICS.inc("kimik3_router_requests_total", &[("route", self.route.label), ("outcome", "cut")]);
        self.done = true;
        for span in [&self.leg.span, &self.ctx.span] {
            span.set("kimik3.outcome", "cut");
            span.set("kimik3.cut_reason", reason);
            span.fail(message);
        }
        (self.route.stream_error)(status, kind, message)
    }

    /// The engine failed: moved on, or the stream cut with the engine's failure (and why it could
    /// not move, when it tried).
    fn failed(&mut self, reason: &'static str, status: u16, kind: &str, message: &str) -> Option<Bytes> {
        match self.engine_failed(reason, message) {
            Ok(()) => None,
            // The finish had gone out: the answer is whole; only the stream's end was missing.
            Err("finished") => {
                self.done = true;
                METRICS.inc("kimik3_router_requests_total", &[("route", self.route.label), ("outcome", "ok")]);
                self.ctx.span.set("kimik3.outcome", "ok");
                Some(Bytes::from_static(b"data: [DONE]\n\n"))
            }
            Err(why) if why == "off" || self.refused == Some(why) => Some(self.cut(reason, status, kind, message)),
            Err(why) => Some(self.cut(reason, status, kind, &format!("{message}; the stream could not move ({why})"))),
        }
    }

    fn finished(&mut self) {
        if let Some(ids) = self.sse.resume.as_ref().and_then(Resume::prompt_ids) {
            self.app.learned_prompt_ids(&self.ctx, &ids);
        }
        self.leg_outcome("ok");
        METRICS.inc("kimik3_router_requests_total", &[("route", self.route.label), ("outcome", "ok")]);
        self.leg.worker.endpoint.record_success();
        self.leg.span.set("kimik3.outcome", "ok");
        self.done = true;
    }

    fn out(&mut self, bytes: Bytes, arrived: Instant) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.idle_armed = false;
        // An engine's error event: what came before it goes out now, the failure on the next poll.
        if matches!(self.sse.halt, Some(Halt::EngineError(_))) && bytes.is_empty() {
            return Poll::Ready(Some(Ok(Frame::data(bytes))));
        }
        METRICS.added_chunk.observe(arrived.elapsed());
        if let Some(Halt::Refused(why)) = self.sse.halt {
            let mut all = bytes.to_vec();
            let message =
                format!("the stream moved to another engine and then needed what the router cannot parse ({why})");
            all.extend_from_slice(&self.cut("migration_refused", 502, "upstream_error", &message));
            return Poll::Ready(Some(Ok(Frame::data(Bytes::from(all)))));
        }
        Poll::Ready(Some(Ok(Frame::data(bytes))))
    }

    fn data(bytes: Bytes) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(Some(Ok(Frame::data(bytes))))
    }
}

impl hyper::body::Body for RelayBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        loop {
            if let Some(Halt::EngineError(message)) = this.sse.halt.take_if(|h| matches!(h, Halt::EngineError(_))) {
                if let Some(out) = this.failed("engine_error", 502, "upstream_error", &message) {
                    return Self::data(out);
                }
            }
            if let Some(Ok(moving)) = this.moving.as_mut().map(Mutex::get_mut) {
                match moving.as_mut().poll(cx) {
                    Poll::Pending => {
                        if this.deadline.as_mut().poll(cx).is_ready() {
                            this.moving = None;
                            return Self::data(this.cut("request_timeout", 504, "timeout", "the request timed out"));
                        }
                        return Poll::Pending;
                    }
                    Poll::Ready(Ok(up)) => {
                        this.moving = None;
                        this.first = Some((up.first.clone(), up.arrived));
                        this.leg = up;
                        this.idle_armed = false;
                    }
                    Poll::Ready(Err(f)) => {
                        this.moving = None;
                        f.mark(&this.leg.span);
                        METRICS.inc("kimik3_router_migrations_total", &[("outcome", "failed")]);
                        let (status, kind, message) = f.client_error();
                        let message = format!("the stream's engine failed and moving it failed too: {message}");
                        return Self::data(this.cut("migration_failed", status, kind, &message));
                    }
                }
            }
            if let Some((first, arrived)) = this.first.take() {
                if let Some(out) = this.sse.push(first) {
                    return this.out(out, arrived);
                }
            }
            if !this.idle_armed {
                this.idle.as_mut().reset(tokio::time::Instant::now() + this.app.cfg.idle_gap_timeout);
                this.idle_armed = true;
            }
            let failure = loop {
                match poll_data(&mut this.leg.incoming, cx) {
                    Poll::Ready(Ok(Some(data))) => {
                        let arrived = Instant::now();
                        match this.sse.push(data) {
                            Some(out) => return this.out(out, arrived),
                            // An event not complete yet: bytes did come, so the gap starts again.
                            None => {
                                this.idle.as_mut().reset(tokio::time::Instant::now() + this.app.cfg.idle_gap_timeout)
                            }
                        }
                    }
                    Poll::Ready(Err(e)) => {
                        break ("upstream_error", 502, "upstream_error", format!("the engine's stream broke: {e}"));
                    }
                    Poll::Ready(Ok(None)) if this.sse.saw_done => {
                        this.finished();
                        return Poll::Ready(None);
                    }
                    Poll::Ready(Ok(None)) => {
                        let m = "the engine ended the stream before it was complete".to_string();
                        break ("ended_early", 502, "upstream_error", m);
                    }
                    Poll::Pending => {
                        if this.deadline.as_mut().poll(cx).is_ready() {
                            return Self::data(this.cut("request_timeout", 504, "timeout", "the request timed out"));
                        }
                        if this.idle.as_mut().poll(cx).is_ready() {
                            break ("idle_gap", 504, "timeout", "the engine stalled mid-stream".to_string());
                        }
                        return Poll::Pending;
                    }
                }
            };
            let (reason, status, kind, message) = failure;
            if let Some(out) = this.failed(reason, status, kind, &message) {
                return Self::data(out);
            }
            // Moving: poll the continuation on the next turn of the loop.
        }
    }
}

fn outcome_of(status: u16) -> &'static str {
    match status {
        200..=299 => "ok",
        404 => "not_found",
        413 => "too_large",
        400..=499 => "client_error",
        502 => "upstream_error",
        503 => "no_engine",
        504 => "timeout",
        _ => "error",
    }
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        if b == b'%' {
            if let Some(v) = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
            {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_relay_passes_events_and_rewrites_usage() {
        let prefill = json!({"usage": {"prompt_tokens": 10, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 4}}});
        let mut r = SseRelay::new(&crate::routes::ROUTES[0], Some(prefill), None);
        let plain = Bytes::from_static(b"data: {\"choices\":[]}\n\n");
        assert_eq!(r.push(plain.clone()), Some(plain));
        assert_eq!(r.push(Bytes::from_static(b"data: {\"usage\":{\"prompt_tokens\":10,")), None);
        let out = r.push(Bytes::from_static(b"\"completion_tokens\":5}}\n\ndata: [DONE]\n\n")).unwrap_or_default();
        let text = String::from_utf8_lossy(&out);
        assert!(text.contains("\"cached_tokens\":4") && text.contains("\"total_tokens\":15"), "{text}");
        assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
        assert!(r.saw_done);
    }

    #[test]
    fn a_responses_stream_ends_with_its_completed_event_and_its_usage_is_rewritten() {
        let prefill =
            json!({"usage": {"input_tokens": 10, "output_tokens": 1, "input_tokens_details": {"cached_tokens": 4}}});
        let route = crate::routes::Route::find("/v1/responses").unwrap_or(&crate::routes::ROUTES[0]);
        let mut r = SseRelay::new(route, Some(prefill), None);
        let delta = Bytes::from_static(b"event: response.output_text.delta\ndata: {\"delta\":\"data: [DONE]\"}\n\n");
        assert_eq!(r.push(delta.clone()), Some(delta));
        assert!(!r.saw_done, "a chat marker inside a responses event ends nothing");
        let done = r.push(Bytes::from_static(
            b"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":10,\"output_tokens\":5,\"input_tokens_details\":{\"cached_tokens\":0}}}}\n\n",
        ));
        let text = String::from_utf8_lossy(done.as_deref().unwrap_or_default()).into_owned();
        assert!(text.starts_with("event: response.completed\ndata: {"), "{text}");
        assert!(text.contains("\"cached_tokens\":4") && text.contains("\"total_tokens\":15"), "{text}");
        assert!(r.saw_done);
    }

    #[test]
    fn every_status_maps_to_an_outcome_exported_from_the_start() {
        for status in 100..600 {
            assert!(crate::metrics::OUTCOMES.contains(&outcome_of(status)), "{status} -> {}", outcome_of(status));
        }
        let text = METRICS.render();
        for line in [
            "kimik3_router_requests_total{route=\"chat_completions\",outcome=\"upstream_error\"}",
            "kimik3_router_requests_total{route=\"other\",outcome=\"connection_refused\"}",
            "kimik3_router_streams_cut_total{reason=\"idle_gap\"}",
            "kimik3_router_retries_total{kind=\"reprefill\"}",
            "kimik3_router_retry_budget_exhausted_total{}",
        ] {
            assert!(text.lines().any(|l| l.starts_with(line)), "{line} missing from\n{text}");
        }
    }

    #[test]
    fn retry_budget_has_a_floor_and_a_ratio() {
        let b = RetryBudget::new(0.5, 2);
        assert!(b.try_retry() && b.try_retry());
        assert!(!b.try_retry());
        for _ in 0..4 {
            b.record_request();
        }
        assert!(b.try_retry() && b.try_retry());
        assert!(!b.try_retry());
    }
}
