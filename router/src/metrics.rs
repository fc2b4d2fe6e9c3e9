//! Prometheus text exposition on the metrics port. Every label comes from a bounded set (role,
//! engine address, outcome, stage...): never a request id, session key or model name from a request.

use crate::routes::ROUTES;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex};
use std::time::Duration;

/// (name, type, help) of every family this router exports.
pub const FAMILIES: &[(&str, &str, &str)] = &[
    ("kimik3_router_requests_total", "counter", "Client requests by route and outcome."),
    ("kimik3_router_leg_requests_total", "counter", "Requests sent to engines, by role, engine and outcome."),
    (
        "kimik3_router_retries_total",
        "counter",
        "Legs sent again, by kind (prefill, decode_same_params, reprefill, aggregated, migration).",
    ),
    ("kimik3_router_retry_budget_exhausted_total", "counter", "Retries refused because the retry budget was spent."),
    ("kimik3_router_streams_cut_total", "counter", "Client streams ended with an SSE error event, by reason."),
    (
        "kimik3_router_kv_events_total",
        "counter",
        "KV event batches from the prefill engines, by outcome: applied, replayed (a gap filled), gap_cleared and restart_cleared (a rank's index forgotten), disconnected, undecodable.",
    ),
    (
        "kimik3_router_token_ids_total",
        "counter",
        "precise_prefix: where a prompt's token ids came from (body, continued: a chat the router saw it continue, tokenize, none: routed by text); refreshed (a continued chat tokenized after it was sent, for the next turn); prefix_mismatch (a continued prompt that was not one: the continued source turns off).",
    ),
    (
        "kimik3_router_kv_index_blocks",
        "gauge",
        "Blocks the router knows an engine's cache holds (all ranks), by role, engine and KV cache group (mla_attention, mamba).",
    ),
    (
        "kimik3_router_migrations_total",
        "counter",
        "Streams whose engine failed mid-way, by outcome: moved to another engine, failed, or why they could not move.",
    ),
    (
        "kimik3_router_engine_ejections_total",
        "counter",
        "Engines ejected after consecutive failures, by role and engine.",
    ),
    (
        "kimik3_router_engine_healthy",
        "gauge",
        "1 when the engine is routable (probe up, not ejected), by role and engine.",
    ),
    ("kimik3_router_engine_in_flight", "gauge", "Requests in flight on the engine, by role and engine."),
    ("kimik3_router_engines", "gauge", "Routable engines (workers: one per data-parallel rank) by role."),
    (
        "kimik3_router_prefix_routing_decisions_total",
        "counter",
        "cache_aware and precise_prefix decisions by role and decision.",
    ),
    (
        "kimik3_router_prefix_hit_tokens_total",
        "counter",
        "precise_prefix: prompt tokens the chosen engine's cache holds by its KV events (a true K3 hit), by role.",
    ),
    (
        "kimik3_router_prefix_prompt_tokens_total",
        "counter",
        "precise_prefix: prompt tokens of the requests it routed by their ids, by role.",
    ),
    ("kimik3_router_discovery_events_total", "counter", "Pod discovery events by kind."),
    ("kimik3_router_in_flight_requests", "gauge", "Client requests being served."),
    (
        "kimik3_router_added_seconds",
        "histogram",
        "Time the router adds, by stage: request_to_upstream (request headers in to the first upstream request sent), body_to_upstream (the same from the request body's last byte in), chunk_relay (an upstream chunk in to handed to the client connection), tokenize (the precise_prefix policy asking an engine for a prompt's token ids).",
    ),
    ("kimik3_router_request_duration_seconds", "histogram", "Client request duration by route."),
    (
        "kimik3_router_spans_total",
        "counter",
        "The router's own trace spans by outcome: exported, failed (the collector refused or was unreachable), dropped (the export queue was full).",
    ),
];

const ADDED_BUCKETS: &[f64] =
    &[0.00005, 0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.0025, 0.003, 0.005, 0.01, 0.025, 0.1, 1.0];
const DURATION_BUCKETS: &[f64] = &[0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0];

pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<AtomicU64>,
    count: AtomicU64,
    sum_nanos: AtomicU64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: bounds.iter().map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            sum_nanos: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        if let Some(i) = self.bounds.iter().position(|b| secs <= *b) {
            if let Some(c) = self.counts.get(i) {
                c.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_nanos.fetch_add(d.as_nanos().min(u64::MAX as u128) as u64, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let mut cumulative = 0;
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            cumulative += c.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{b}\"}} {cumulative}");
        }
        let count = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {count}");
        let sum = self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        let _ = writeln!(out, "{name}_sum{{{labels}}} {sum}");
        let _ = writeln!(out, "{name}_count{{{labels}}} {count}");
    }
}

pub struct Metrics {
    series: Mutex<BTreeMap<(&'static str, String), f64>>,
    pub added_request: Histogram,
    pub added_body: Histogram,
    pub added_chunk: Histogram,
    pub added_tokenize: Histogram,
    /// One per row of routes::ROUTES, in its order.
    pub duration: Vec<Histogram>,
}

/// Label values known ahead. Their counters are exported at 0 from the start (Prometheus's advice):
/// a series that appears only at its first event makes `rate()` miss that event, and leaves an error
/// panel or alert with nothing to read until something has already gone wrong.
pub const OUTCOMES: &[&str] = &[
    "ok",
    "not_found",
    "too_large",
    "client_error",
    "upstream_error",
    "no_engine",
    "timeout",
    "error",
    "cut",
    "connection_refused",
];
/// Why a stream that had begun was ended with an SSE error event.
pub const CUT_REASONS: &[&str] = &[
    "upstream_error",
    "ended_early",
    "request_timeout",
    "idle_gap",
    "engine_error",
    "migration_failed",
    "migration_refused",
];
/// Which leg a retry sends again.
pub const RETRY_KINDS: &[&str] = &["prefill", "decode_same_params", "reprefill", "aggregated", "migration"];
/// What became of a stream whose engine failed mid-way: moved, failed (the continuation did), or why
/// it could not move (migrate.rs).
pub const MIGRATION_OUTCOMES: &[&str] = &[
    "moved",
    "failed",
    "finished",
    "off",
    "limit",
    "retry_budget",
    "cap_spent",
    "no_token_ids",
    "tool_call_open",
    "n_above_one",
    "guided_decoding",
    "chat_logprobs",
    "include_reasoning_false",
    "prompt_batch",
    "route",
];
pub const SPAN_OUTCOMES: &[&str] = &["exported", "failed", "dropped"];
/// The `route` label of a request no row of routes::ROUTES takes.
pub const OTHER_ROUTE: &str = "other";

fn known_series() -> BTreeMap<(&'static str, String), f64> {
    let mut out = BTreeMap::new();
    for route in ROUTES.iter().map(|r| r.label).chain([OTHER_ROUTE]) {
        for outcome in OUTCOMES {
            out.insert(("kimik3_router_requests_total", labels(&[("route", route), ("outcome", outcome)])), 0.0);
        }
    }
    for reason in CUT_REASONS {
        out.insert(("kimik3_router_streams_cut_total", labels(&[("reason", reason)])), 0.0);
    }
    for kind in RETRY_KINDS {
        out.insert(("kimik3_router_retries_total", labels(&[("kind", kind)])), 0.0);
    }
    for outcome in crate::kv_events::KV_EVENT_OUTCOMES {
        out.insert(("kimik3_router_kv_events_total", labels(&[("outcome", outcome)])), 0.0);
    }
    for source in crate::prompt_ids::SOURCES {
        out.insert(("kimik3_router_token_ids_total", labels(&[("source", source)])), 0.0);
    }
    for outcome in MIGRATION_OUTCOMES {
        out.insert(("kimik3_router_migrations_total", labels(&[("outcome", outcome)])), 0.0);
    }
    out.insert(("kimik3_router_retry_budget_exhausted_total", String::new()), 0.0);
    for outcome in SPAN_OUTCOMES {
        out.insert(("kimik3_router_spans_total", labels(&[("outcome", outcome)])), 0.0);
    }
    out
}

pub static METRICS: LazyLock<Metrics> = LazyLock::new(|| Metrics {
    series: Mutex::new(known_series()),
    added_request: Histogram::new(ADDED_BUCKETS),
    added_body: Histogram::new(ADDED_BUCKETS),
    added_chunk: Histogram::new(ADDED_BUCKETS),
    added_tokenize: Histogram::new(ADDED_BUCKETS),
    duration: ROUTES.iter().map(|_| Histogram::new(DURATION_BUCKETS)).collect(),
});

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

fn labels(pairs: &[(&str, &str)]) -> String {
    pairs.iter().map(|(k, v)| format!("{k}=\"{}\"", escape(v))).collect::<Vec<_>>().join(",")
}

impl Metrics {
    /// Export a counter's series at 0 if it is not yet (an engine's ejections once it is routable).
    pub fn declare(&self, name: &'static str, pairs: &[(&str, &str)]) {
        self.add(name, pairs, 0.0);
    }

    pub fn inc(&self, name: &'static str, pairs: &[(&str, &str)]) {
        self.add(name, pairs, 1.0);
    }

    pub fn add(&self, name: &'static str, pairs: &[(&str, &str)], by: f64) {
        if let Ok(mut s) = self.series.lock() {
            *s.entry((name, labels(pairs))).or_insert(0.0) += by;
        }
    }

    pub fn set(&self, name: &'static str, pairs: &[(&str, &str)], value: f64) {
        if let Ok(mut s) = self.series.lock() {
            s.insert((name, labels(pairs)), value);
        }
    }

    /// Forget every series of an engine that left (keeps the label set bounded by the live fleet).
    pub fn forget_engine(&self, engine: &str) {
        let needle = format!("engine=\"{}\"", escape(engine));
        if let Ok(mut s) = self.series.lock() {
            s.retain(|(_, l), _| !l.split(',').any(|p| p == needle));
        }
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        let series = self.series.lock().map(|s| s.clone()).unwrap_or_default();
        for (name, kind, help) in FAMILIES {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
            match *name {
                "kimik3_router_added_seconds" => {
                    self.added_request.render(&mut out, name, "stage=\"request_to_upstream\"");
                    self.added_body.render(&mut out, name, "stage=\"body_to_upstream\"");
                    self.added_chunk.render(&mut out, name, "stage=\"chunk_relay\"");
                    self.added_tokenize.render(&mut out, name, "stage=\"tokenize\"");
                }
                "kimik3_router_request_duration_seconds" => {
                    for (h, route) in self.duration.iter().zip(ROUTES.iter()) {
                        h.render(&mut out, name, &format!("route=\"{}\"", route.label));
                    }
                }
                _ => {
                    for ((n, l), v) in series.range((*name, String::new())..) {
                        if n != name {
                            break;
                        }
                        let _ = writeln!(out, "{n}{{{l}}} {v}");
                    }
                }
            }
        }
        out
    }
}
