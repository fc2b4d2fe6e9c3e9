//! The router's own OpenTelemetry spans: one SERVER span per client request and one CLIENT span per
//! leg sent to an engine (prefill, decode, aggregated; a retried leg is a span of its own), each leg
//! carrying a W3C `traceparent` that names its span, so the engine's spans (vLLM's
//! `--otlp-traces-endpoint`) nest under the leg that caused them. Exported as OTLP/HTTP with JSON
//! encoding, batched by one task; a full queue drops spans (counted), never a request.
//!
//! Hand-written rather than the opentelemetry crates: what is needed is span ids, the traceparent
//! header and one JSON shape (about 200 lines), while opentelemetry-otlp's HTTP exporter brings
//! prost and an HTTP client stack of its own into a crate that keeps its dependencies few (it builds
//! twice in CI: the host binary and the image). JSON is OTLP/HTTP's second encoding, which the
//! OpenTelemetry Collector's otlp receiver takes on the same port as protobuf.
//!
//! Without --otlp-traces-endpoint nothing is recorded and a client's `traceparent`/`tracestate`
//! pass to every leg unchanged, as before.

use crate::config::TraceExport;
use crate::metrics::METRICS;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request};
use http_body_util::Full;
use serde_json::{Value, json};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;

const QUEUE: usize = 8192;
const BATCH: usize = 512;
const FLUSH: Duration = Duration::from_secs(1);

struct Tracer {
    tx: mpsc::Sender<Finished>,
    ratio: f64,
}

static TRACER: OnceLock<Tracer> = OnceLock::new();
static RNG: AtomicU64 = AtomicU64::new(0);

/// Start the exporter (inside the runtime) when the command line asks for one.
pub fn init(export: Option<&TraceExport>, seed: u64) {
    RNG.store(seed, Ordering::Relaxed);
    let Some(export) = export else { return };
    let (tx, rx) = mpsc::channel(QUEUE);
    if TRACER.set(Tracer { tx, ratio: export.sample_ratio }).is_ok() {
        tokio::spawn(exporter(export.clone(), rx));
    }
}

/// splitmix64 over a shared counter: ids unique per process and spread over the id space (not a
/// secret: W3C trace context asks ids to be random, not unguessable).
fn random() -> u64 {
    let mut z = RNG.fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn span_id() -> [u8; 8] {
    loop {
        let id = random();
        if id != 0 {
            return id.to_be_bytes();
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::with_capacity(2 * bytes.len()), |mut out, b| {
        let _ = write!(out, "{b:02x}");
        out
    })
}

fn unhex<const N: usize>(s: &str) -> Option<[u8; N]> {
    if s.len() != 2 * N || !s.bytes().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)) {
        return None;
    }
    let mut out = [0u8; N];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    (out != [0u8; N]).then_some(out)
}

/// A caller's `traceparent` (version 00 as W3C Trace Context level 1 reads it; a later version's
/// first four fields): trace id, parent span id, sampled flag.
fn parse_traceparent(v: &str) -> Option<([u8; 16], [u8; 8], bool)> {
    let mut parts = v.trim().split('-');
    let version = parts.next()?;
    let (trace, parent, flags) = (parts.next()?, parts.next()?, parts.next()?);
    let lower_hex = |s: &str| s.len() == 2 && s.bytes().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c));
    if !lower_hex(version) || version == "ff" || (version == "00" && parts.next().is_some()) || !lower_hex(flags) {
        return None;
    }
    let flags = u8::from_str_radix(flags, 16).ok()?;
    Some((unhex::<16>(trace)?, unhex::<8>(parent)?, flags & 1 == 1))
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    Server = 2,
    Client = 3,
}

pub enum Attr {
    Str(String),
    Int(i64),
}

impl From<&str> for Attr {
    fn from(s: &str) -> Self {
        Self::Str(s.to_string())
    }
}
impl From<String> for Attr {
    fn from(s: String) -> Self {
        Self::Str(s)
    }
}
impl From<i64> for Attr {
    fn from(n: i64) -> Self {
        Self::Int(n)
    }
}

struct Finished {
    trace: [u8; 16],
    id: [u8; 8],
    parent: Option<[u8; 8]>,
    name: String,
    kind: Kind,
    start: u64,
    end: u64,
    attrs: Vec<(&'static str, Attr)>,
    error: Option<String>,
}

struct Recording {
    name: String,
    kind: Kind,
    start_wall: u64,
    start: Instant,
    attrs: Vec<(&'static str, Attr)>,
    error: Option<String>,
}

/// A span of this router (exported when dropped, if sampled), or only the trace context a leg
/// passes on. Shared (`Arc`) for a request's server span: the relay of a stream holds it, so it
/// ends when the client's answer does.
pub struct Span {
    trace: [u8; 16],
    id: [u8; 8],
    parent: Option<[u8; 8]>,
    sampled: bool,
    state: Option<HeaderValue>,
    /// The caller's own trace headers, passed on unchanged when the router traces nothing.
    incoming: Vec<(&'static str, HeaderValue)>,
    recording: Option<Mutex<Recording>>,
}

fn now_unix_nanos() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
}

impl Span {
    /// The server span of a request, continuing the caller's trace when its traceparent is valid
    /// (its sampled flag decides), else a new trace sampled at the configured ratio.
    pub fn server(headers: &HeaderMap, name: String) -> Self {
        let Some(tracer) = TRACER.get() else {
            let incoming =
                ["traceparent", "tracestate"].iter().filter_map(|n| headers.get(*n).map(|v| (*n, v.clone())));
            return Self::passthrough(incoming.collect());
        };
        let caller = headers.get("traceparent").and_then(|v| v.to_str().ok()).and_then(parse_traceparent);
        let (trace, parent, sampled) = match caller {
            Some((trace, parent, sampled)) => (trace, Some(parent), sampled),
            None => {
                let mut t = [0u8; 16];
                t[..8].copy_from_slice(&span_id());
                t[8..].copy_from_slice(&span_id());
                (t, None, ((random() >> 11) as f64) < tracer.ratio * (1u64 << 53) as f64)
            }
        };
        let state = if caller.is_some() { headers.get("tracestate").cloned() } else { None };
        Self::open(trace, span_id(), parent, sampled, state, name, Kind::Server)
    }

    fn open(
        trace: [u8; 16],
        id: [u8; 8],
        parent: Option<[u8; 8]>,
        sampled: bool,
        state: Option<HeaderValue>,
        name: String,
        kind: Kind,
    ) -> Self {
        let recording = sampled.then(|| {
            Mutex::new(Recording {
                name,
                kind,
                start_wall: now_unix_nanos(),
                start: Instant::now(),
                attrs: Vec::new(),
                error: None,
            })
        });
        Self { trace, id, parent, sampled, state, incoming: Vec::new(), recording }
    }

    /// A span under this one (a leg), recording when this one records.
    pub fn child(&self, name: &str, kind: Kind) -> Self {
        if TRACER.get().is_none() {
            return Self::passthrough(self.incoming.clone());
        }
        Self::open(self.trace, span_id(), Some(self.id), self.sampled, self.state.clone(), name.to_string(), kind)
    }

    fn passthrough(incoming: Vec<(&'static str, HeaderValue)>) -> Self {
        Self { trace: [0; 16], id: [0; 8], parent: None, sampled: false, state: None, incoming, recording: None }
    }

    /// The trace headers a request sent under this span carries.
    pub fn headers(&self) -> Vec<(&'static str, HeaderValue)> {
        if TRACER.get().is_none() {
            return self.incoming.clone();
        }
        let parent = format!("00-{}-{}-{}", hex(&self.trace), hex(&self.id), if self.sampled { "01" } else { "00" });
        let mut out: Vec<(&'static str, HeaderValue)> =
            HeaderValue::from_str(&parent).map(|v| vec![("traceparent", v)]).unwrap_or_default();
        if let Some(state) = &self.state {
            out.push(("tracestate", state.clone()));
        }
        out
    }

    pub fn set(&self, key: &'static str, value: impl Into<Attr>) {
        if let Some(r) = &self.recording {
            if let Ok(mut r) = r.lock() {
                let value = value.into();
                match r.attrs.iter_mut().find(|(k, _)| *k == key) {
                    Some(slot) => slot.1 = value,
                    None => r.attrs.push((key, value)),
                }
            }
        }
    }

    /// Mark the span failed (OTLP status ERROR) with a message.
    pub fn fail(&self, message: &str) {
        if let Some(r) = &self.recording {
            if let Ok(mut r) = r.lock() {
                r.error = Some(message.chars().take(512).collect());
            }
        }
    }
}

impl Drop for Span {
    fn drop(&mut self) {
        let (Some(tracer), Some(recording)) = (TRACER.get(), self.recording.take()) else { return };
        let Ok(r) = recording.into_inner() else { return };
        let span = Finished {
            trace: self.trace,
            id: self.id,
            parent: self.parent,
            end: r.start_wall.saturating_add(r.start.elapsed().as_nanos() as u64),
            name: r.name,
            kind: r.kind,
            start: r.start_wall,
            attrs: r.attrs,
            error: r.error,
        };
        if tracer.tx.try_send(span).is_err() {
            METRICS.inc("kimik3_router_spans_total", &[("outcome", "dropped")]);
        }
    }
}

fn attr_json((key, value): &(&'static str, Attr)) -> Value {
    match value {
        Attr::Str(s) => json!({"key": key, "value": {"stringValue": s}}),
        Attr::Int(n) => json!({"key": key, "value": {"intValue": n.to_string()}}),
    }
}

/// One OTLP/HTTP JSON export request (opentelemetry-proto's ExportTraceServiceRequest, JSON
/// mapping: ids as hex, 64-bit integers as strings).
fn export_body(export: &TraceExport, instance: &str, spans: &[Finished]) -> Value {
    let spans: Vec<Value> = spans
        .iter()
        .map(|s| {
            let mut v = json!({
                "traceId": hex(&s.trace), "spanId": hex(&s.id), "name": s.name, "kind": s.kind as i32,
                "startTimeUnixNano": s.start.to_string(), "endTimeUnixNano": s.end.to_string(),
                "attributes": s.attrs.iter().map(attr_json).collect::<Vec<_>>(),
                // UNSET unless failed: OpenTelemetry leaves OK to applications, not instrumentation.
                "status": match &s.error { Some(m) => json!({"code": 2, "message": m}), None => json!({}) },
            });
            if let (Some(parent), Some(obj)) = (s.parent, v.as_object_mut()) {
                obj.insert("parentSpanId".into(), Value::String(hex(&parent)));
            }
            v
        })
        .collect();
    json!({"resourceSpans": [{
        "resource": {"attributes": [
            {"key": "service.name", "value": {"stringValue": export.service_name}},
            {"key": "service.instance.id", "value": {"stringValue": instance}},
            {"key": "service.version", "value": {"stringValue": env!("CARGO_PKG_VERSION")}},
        ]},
        "scopeSpans": [{"scope": {"name": "kimik3-router", "version": env!("CARGO_PKG_VERSION")}, "spans": spans}],
    }]})
}

async fn post(export: &TraceExport, body: Vec<u8>) -> Result<(), String> {
    let req = Request::post(export.path.as_str())
        .header(http::header::HOST, export.authority.as_str())
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| e.to_string())?;
    let work = async {
        let resp = crate::upstream::send(&export.authority, req, Duration::from_secs(2))
            .await
            .map_err(|e| e.message().to_string())?;
        let status = resp.status();
        let _ = crate::upstream::read_body(resp.into_body(), 1 << 20).await;
        if status.is_success() { Ok(()) } else { Err(format!("the collector answered {}", status.as_u16())) }
    };
    tokio::time::timeout(Duration::from_secs(10), work).await.map_err(|_| "timed out".to_string())?
}

async fn exporter(export: TraceExport, mut rx: mpsc::Receiver<Finished>) {
    let instance = std::env::var("HOSTNAME").unwrap_or_else(|_| format!("pid-{}", std::process::id()));
    let mut last_warning: Option<Instant> = None;
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        let until = tokio::time::Instant::now() + FLUSH;
        while batch.len() < BATCH {
            match tokio::time::timeout_at(until, rx.recv()).await {
                Ok(Some(span)) => batch.push(span),
                Ok(None) | Err(_) => break,
            }
        }
        let body = serde_json::to_vec(&export_body(&export, &instance, &batch)).unwrap_or_default();
        match post(&export, body).await {
            Ok(()) => METRICS.add("kimik3_router_spans_total", &[("outcome", "exported")], batch.len() as f64),
            Err(e) => {
                METRICS.add("kimik3_router_spans_total", &[("outcome", "failed")], batch.len() as f64);
                if last_warning.is_none_or(|t| t.elapsed() > Duration::from_secs(60)) {
                    crate::warn!(
                        "exporting {} spans to http://{}{} failed: {e} (said at most once a minute)",
                        batch.len(),
                        export.authority,
                        export.path
                    );
                    last_warning = Some(Instant::now());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_is_read_as_w3c_trace_context_says() {
        let ok = parse_traceparent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01").unwrap();
        assert_eq!(hex(&ok.0), "0af7651916cd43dd8448eb211c80319c");
        assert_eq!(hex(&ok.1), "b7ad6b7169203331");
        assert!(ok.2);
        assert!(!parse_traceparent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00").unwrap().2);
        // A later version: its first four fields, extra ones ignored.
        assert!(parse_traceparent("01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-what").is_some());
        for bad in [
            "00-00000000000000000000000000000000-b7ad6b7169203331-01", // all-zero trace id
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01", // all-zero parent
            "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01", // upper case
            "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", // version ff
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-x", // version 00 has 4 fields
            "zz-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", // version not hex
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-+1", // flags not hex
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-0A", // flags upper case
            "00-0af7651916cd43dd8448eb211c80319-b7ad6b7169203331-01",  // short trace id
            "garbage",
        ] {
            assert!(parse_traceparent(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn export_body_is_otlp_json() {
        let export = TraceExport {
            authority: "c:4318".into(),
            path: "/v1/traces".into(),
            sample_ratio: 1.0,
            service_name: "kimik3-router".into(),
        };
        let span = Finished {
            trace: [1; 16],
            id: [2; 8],
            parent: Some([3; 8]),
            name: "decode".into(),
            kind: Kind::Client,
            start: 10,
            end: 20,
            attrs: vec![("kimik3.role", "decode".into()), ("http.response.status_code", 200i64.into())],
            error: Some("engine_down".into()),
        };
        let v = export_body(&export, "router-0", &[span]);
        let s = &v["resourceSpans"][0]["scopeSpans"][0]["spans"][0];
        assert_eq!(s["traceId"], "01010101010101010101010101010101");
        assert_eq!(s["parentSpanId"], "0303030303030303");
        assert_eq!(s["kind"], 3);
        assert_eq!(s["startTimeUnixNano"], "10");
        assert_eq!(s["status"]["code"], 2);
        assert_eq!(s["attributes"][1]["value"]["intValue"], "200");
        assert_eq!(v["resourceSpans"][0]["resource"]["attributes"][0]["value"]["stringValue"], "kimik3-router");
    }
}
