//! The command line: hand-parsed (no clap), every flag documented in docs/router.md.
//!
//! `kimik3-router --check-args <args...>` parses the rest exactly as a start would and exits 0, or 2
//! with a one-line reason on stderr: the operator checks every command line it renders with it.

use std::collections::BTreeMap;
use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    PrefillDecode,
    Aggregated,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PolicyKind {
    CacheAware,
    RoundRobin,
    ConsistentHash,
    StickyLeastLoaded,
    Random,
    /// The (engine, rank) with the longest true K3 hit, from the engines' KV events (kv_events.rs).
    PrecisePrefix,
}

impl PolicyKind {
    pub fn parse(value: &str) -> Result<Self, String> {
        Ok(match value {
            "cache_aware" => Self::CacheAware,
            "round_robin" => Self::RoundRobin,
            "consistent_hash" => Self::ConsistentHash,
            "sticky_least_loaded" => Self::StickyLeastLoaded,
            "random" => Self::Random,
            "precise_prefix" => Self::PrecisePrefix,
            other => {
                return Err(format!(
                    "unknown policy {other:?} (cache_aware, round_robin, consistent_hash, sticky_least_loaded, random, precise_prefix)"
                ));
            }
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::CacheAware => "cache_aware",
            Self::RoundRobin => "round_robin",
            Self::ConsistentHash => "consistent_hash",
            Self::StickyLeastLoaded => "sticky_least_loaded",
            Self::Random => "random",
            Self::PrecisePrefix => "precise_prefix",
        }
    }
}

/// An engine given on the command line: `http://host:port` with an optional `@rank` that pins one
/// data-parallel rank (else the ranks are read from the engine's /metrics).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StaticEngine {
    pub authority: String,
    pub rank: Option<u32>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Selector(pub BTreeMap<String, String>);

impl Selector {
    /// `k=v[,k=v...]`: Kubernetes label names and values (equality only).
    pub fn parse(value: &str) -> Result<Self, String> {
        let mut pairs = BTreeMap::new();
        for pair in value.split(',') {
            let (k, v) = pair.split_once('=').ok_or_else(|| format!("selector pair {pair:?} is not k=v"))?;
            if k.is_empty() || !k.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_./".contains(&b)) {
                return Err(format!("selector key {k:?} is not a label name"));
            }
            if !v.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)) {
                return Err(format!("selector value {v:?} is not a label value"));
            }
            if pairs.insert(k.to_string(), v.to_string()).is_some() {
                return Err(format!("selector key {k:?} given twice"));
            }
        }
        Ok(Self(pairs))
    }

    /// The server-side `labelSelector` query value (URL-encoded).
    pub fn query(&self) -> String {
        let joined: Vec<String> = self.0.iter().map(|(k, v)| format!("{k}={v}")).collect();
        percent_encode(&joined.join(","))
    }
}

pub fn percent_encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len() * 3);
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[derive(Clone, Debug)]
pub enum Engines {
    Static { prefill: Vec<StaticEngine>, decode: Vec<StaticEngine>, workers: Vec<StaticEngine> },
    Discovery { namespace: String, prefill: Option<Selector>, decode: Option<Selector>, aggregated: Option<Selector> },
}

#[derive(Clone, Debug)]
pub struct Config {
    pub host: String,
    pub port: u16,
    pub metrics_host: String,
    pub metrics_port: u16,
    pub mode: Mode,
    pub engines: Engines,
    pub engine_port: u16,
    pub prefill_policy: PolicyKind,
    pub decode_policy: PolicyKind,
    pub policy: PolicyKind,
    pub served_model_name: String,
    pub max_payload_size: usize,
    pub max_connections: usize,
    pub request_timeout: Duration,
    pub drain: Duration,
    pub header_timeout: Duration,
    pub body_timeout: Duration,
    pub connect_timeout: Duration,
    pub first_token_timeout: Duration,
    pub prefill_tokens_per_sec: f64,
    pub idle_gap_timeout: Duration,
    pub max_retries: u32,
    /// Times one stream may move to another engine mid-way (migrate.rs); 0: never.
    pub max_migrations: u32,
    pub retry_budget_ratio: f64,
    pub retry_budget_floor: u32,
    pub health_interval: Duration,
    pub health_timeout: Duration,
    pub eject_after: u32,
    pub eject_duration: Duration,
    pub kube_token_dir: String,
    pub cache_threshold: f64,
    pub balance_abs_threshold: usize,
    pub balance_rel_threshold: f64,
    /// Where the router's own spans go (trace.rs), if anywhere.
    pub traces: Option<TraceExport>,
    /// Follow the prefill engines' KV events (kv_events.rs): `--kv-events true`, or a precise_prefix policy.
    pub kv_events: bool,
    /// How long the precise_prefix policy waits at least for an engine's /tokenize before it routes
    /// by text (longer for a long prompt: proxy.rs tokenize_budget).
    pub tokenize_timeout: Duration,
    /// Tokens of chat prompts kept for precise_prefix's continuing chats (prompt_ids.rs); 0: none.
    pub prompt_ids_cap: usize,
}

/// OTLP/HTTP export of the router's spans (JSON encoding, plain HTTP: a collector in the cluster).
#[derive(Clone, Debug)]
pub struct TraceExport {
    /// host:port of the collector, and the path spans are posted to (the URL's, as given).
    pub authority: String,
    pub path: String,
    /// Share of traces that start at the router which are kept; a caller's sampled flag wins.
    pub sample_ratio: f64,
    pub service_name: String,
}

fn trace_export(single: &BTreeMap<&str, String>) -> Result<Option<TraceExport>, String> {
    let Some(url) = single.get("otlp-traces-endpoint") else {
        for flag in ["trace-sample-ratio", "trace-service-name"] {
            if single.contains_key(flag) {
                return Err(format!("--{flag} needs --otlp-traces-endpoint"));
            }
        }
        return Ok(None);
    };
    let Some(rest) = url.strip_prefix("http://") else {
        return Err(format!(
            "--otlp-traces-endpoint {url:?}: only http:// is supported (an OTLP/HTTP receiver in the cluster)"
        ));
    };
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    // The URL is the traces endpoint itself (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT's meaning); a bare
    // host gets OTLP/HTTP's default path.
    let path = if path.is_empty() || path == "/" { "/v1/traces" } else { path };
    if authority.is_empty() || authority.contains(['@', ' ', '?', '#']) {
        return Err(format!("--otlp-traces-endpoint {url:?}: needs http://host[:port]/path"));
    }
    // host, host:port, [v6] or [v6]:port; a port that is not one is refused, not defaulted.
    let port = if authority.ends_with(']') { None } else { authority.rsplit_once(':').map(|(_, p)| p) };
    let authority = match port {
        None => format!("{authority}:80"),
        Some(p) if p.parse::<u16>().is_ok_and(|p| p > 0) => authority.to_string(),
        Some(p) => return Err(format!("--otlp-traces-endpoint {url:?}: {p:?} is not a port")),
    };
    let sample_ratio: f64 = num(single, "trace-sample-ratio", 1.0)?;
    if !(0.0..=1.0).contains(&sample_ratio) {
        return Err("--trace-sample-ratio must be between 0 and 1".into());
    }
    Ok(Some(TraceExport {
        authority,
        path: path.to_string(),
        sample_ratio,
        service_name: single.get("trace-service-name").cloned().unwrap_or_else(|| "kimik3-router".into()),
    }))
}

pub const USAGE: &str = "usage: kimik3-router [--check-args] --served-model-name NAME --mode pd|aggregated \
(--namespace NS --prefill-selector k=v,.. --decode-selector k=v,.. | --prefill URL.. --decode URL.. | \
--namespace NS --selector k=v,.. | --worker URL..) [options]; see docs/router.md";

/// What the command line asks for: run, check only, or print usage.
pub enum Invocation {
    Run(Box<Config>),
    Check,
    Help,
}

pub fn parse_invocation(args: &[String]) -> Result<Invocation, String> {
    match args.first().map(String::as_str) {
        Some("--check-args") => parse(args.get(1..).unwrap_or(&[])).map(|_| Invocation::Check),
        Some("--help") | Some("-h") => Ok(Invocation::Help),
        _ => Ok(Invocation::Run(Box::new(parse(args)?))),
    }
}

const REPEATABLE: &[&str] = &["prefill", "decode", "worker"];
const KNOWN: &[&str] = &[
    "host",
    "port",
    "metrics-host",
    "metrics-port",
    "mode",
    "namespace",
    "engine-port",
    "prefill-selector",
    "decode-selector",
    "selector",
    "prefill",
    "decode",
    "worker",
    "prefill-policy",
    "decode-policy",
    "policy",
    "served-model-name",
    "max-payload-size",
    "max-connections",
    "request-timeout-secs",
    "drain-secs",
    "header-timeout-secs",
    "body-timeout-secs",
    "connect-timeout-ms",
    "first-token-timeout-secs",
    "prefill-tokens-per-sec",
    "idle-gap-timeout-secs",
    "max-retries",
    "max-migrations",
    "retry-budget-ratio",
    "retry-budget-floor",
    "health-interval-ms",
    "health-timeout-ms",
    "eject-after",
    "eject-secs",
    "kube-token-dir",
    "cache-threshold",
    "balance-abs-threshold",
    "balance-rel-threshold",
    "otlp-traces-endpoint",
    "trace-sample-ratio",
    "trace-service-name",
    "kv-events",
    "tokenize-timeout-ms",
    "prompt-ids-cap",
];

pub fn parse(args: &[String]) -> Result<Config, String> {
    let mut single: BTreeMap<&'static str, String> = BTreeMap::new();
    let mut multi: BTreeMap<&'static str, Vec<String>> = BTreeMap::new();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let Some(flag) = arg.strip_prefix("--") else {
            return Err(format!("unexpected argument {arg:?} (every option is --name value)"));
        };
        let (name, inline) = match flag.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (flag, None),
        };
        let Some(known) = KNOWN.iter().find(|k| **k == name) else {
            return Err(format!("unknown flag --{name}"));
        };
        let value = match inline {
            Some(v) => v,
            None => match it.next() {
                Some(v) if !v.starts_with("--") => v.clone(),
                _ => return Err(format!("--{name} needs a value")),
            },
        };
        // An empty served name is one the API and vLLM's own parser take (spec.model.servedName ""):
        // the router answers what its engines answer.
        if value.is_empty() && *known != "served-model-name" {
            return Err(format!("--{name} needs a non-empty value"));
        }
        if REPEATABLE.contains(known) {
            multi.entry(known).or_default().push(value);
        } else if single.insert(known, value).is_some() {
            return Err(format!("--{name} given twice"));
        }
    }
    build(&single, &multi)
}

fn num<T: std::str::FromStr>(single: &BTreeMap<&str, String>, name: &str, default: T) -> Result<T, String> {
    match single.get(name) {
        None => Ok(default),
        Some(v) => v.parse::<T>().map_err(|_| format!("--{name}: {v:?} is not a valid number")),
    }
}

fn positive_f64(single: &BTreeMap<&str, String>, name: &str, default: f64) -> Result<f64, String> {
    let v = num(single, name, default)?;
    if !v.is_finite() || v <= 0.0 {
        return Err(format!("--{name} must be a positive number"));
    }
    Ok(v)
}

fn secs(single: &BTreeMap<&str, String>, name: &str, default: f64) -> Result<Duration, String> {
    let v = num(single, name, default)?;
    if !v.is_finite() || v <= 0.0 || v > 1e7 {
        return Err(format!("--{name} must be a positive number of seconds"));
    }
    Ok(Duration::from_secs_f64(v))
}

fn millis(single: &BTreeMap<&str, String>, name: &str, default: u64) -> Result<Duration, String> {
    let v: u64 = num(single, name, default)?;
    if v == 0 || v > 10_000_000 {
        return Err(format!("--{name} must be a positive number of milliseconds"));
    }
    Ok(Duration::from_millis(v))
}

pub fn parse_engine_url(value: &str) -> Result<StaticEngine, String> {
    let rest = value.strip_prefix("http://").ok_or_else(|| format!("engine URL {value:?} must start with http://"))?;
    let (rest, rank) = match rest.rsplit_once('@') {
        Some((r, rank)) => (r, Some(rank.parse::<u32>().map_err(|_| format!("engine URL {value:?}: bad @rank"))?)),
        None => (rest, None),
    };
    let authority = rest.trim_end_matches('/');
    if authority.contains('/') || authority.is_empty() {
        return Err(format!("engine URL {value:?} must be http://host:port (no path)"));
    }
    let port =
        authority.rsplit_once(':').map(|(_, p)| p).ok_or_else(|| format!("engine URL {value:?} needs a port"))?;
    port.parse::<u16>().map_err(|_| format!("engine URL {value:?} has a bad port"))?;
    Ok(StaticEngine { authority: authority.to_string(), rank })
}

fn build(single: &BTreeMap<&str, String>, multi: &BTreeMap<&str, Vec<String>>) -> Result<Config, String> {
    let mode = match single.get("mode").map(String::as_str) {
        Some("pd") | None => Mode::PrefillDecode,
        Some("aggregated") => Mode::Aggregated,
        Some(other) => return Err(format!("--mode {other:?}: expected pd or aggregated")),
    };
    let served_model_name = single.get("served-model-name").cloned().ok_or("--served-model-name is required")?;
    let list = |name: &str| -> Result<Vec<StaticEngine>, String> {
        multi.get(name).map(|v| v.iter().map(|u| parse_engine_url(u)).collect()).unwrap_or(Ok(Vec::new()))
    };
    let selector = |name: &str| -> Result<Option<Selector>, String> {
        single.get(name).map(|v| Selector::parse(v).map_err(|e| format!("--{name}: {e}"))).transpose()
    };
    let (prefill, decode, workers) = (list("prefill")?, list("decode")?, list("worker")?);
    let (psel, dsel, asel) = (selector("prefill-selector")?, selector("decode-selector")?, selector("selector")?);
    let namespace = single.get("namespace").cloned();
    let engines = match mode {
        Mode::PrefillDecode => {
            if !workers.is_empty() || asel.is_some() || single.contains_key("policy") {
                return Err("--worker, --selector and --policy are for --mode aggregated".into());
            }
            let discovery = psel.is_some() || dsel.is_some();
            let fixed = !prefill.is_empty() || !decode.is_empty();
            match (discovery, fixed) {
                (true, true) => {
                    return Err("give engines either by selectors or by URLs, not both".into());
                }
                (true, false) => {
                    let ns = namespace.ok_or("--prefill-selector/--decode-selector need --namespace")?;
                    if psel.is_none() || dsel.is_none() {
                        return Err("--mode pd needs both --prefill-selector and --decode-selector".into());
                    }
                    Engines::Discovery { namespace: ns, prefill: psel, decode: dsel, aggregated: None }
                }
                (false, true) => {
                    if prefill.is_empty() || decode.is_empty() {
                        return Err("--mode pd needs at least one --prefill and one --decode".into());
                    }
                    if namespace.is_some() {
                        return Err("--namespace is only for discovery by selectors".into());
                    }
                    Engines::Static { prefill, decode, workers }
                }
                (false, false) => {
                    return Err(
                        "--mode pd needs --prefill-selector and --decode-selector (or --prefill and --decode URLs)"
                            .into(),
                    );
                }
            }
        }
        Mode::Aggregated => {
            if !prefill.is_empty() || !decode.is_empty() || psel.is_some() || dsel.is_some() {
                return Err("--prefill/--decode and their selectors are for --mode pd".into());
            }
            if single.contains_key("prefill-policy") || single.contains_key("decode-policy") {
                return Err("--prefill-policy/--decode-policy are for --mode pd (use --policy)".into());
            }
            match (asel, workers.is_empty()) {
                (Some(_), false) => {
                    return Err("give engines either by --selector or by --worker, not both".into());
                }
                (Some(sel), true) => Engines::Discovery {
                    namespace: namespace.ok_or("--selector needs --namespace")?,
                    prefill: None,
                    decode: None,
                    aggregated: Some(sel),
                },
                (None, false) => {
                    if namespace.is_some() {
                        return Err("--namespace is only for discovery by selectors".into());
                    }
                    Engines::Static { prefill, decode, workers }
                }
                (None, true) => {
                    return Err("--mode aggregated needs --selector (or --worker URLs)".into());
                }
            }
        }
    };
    let policy = |name: &str| -> Result<PolicyKind, String> {
        single
            .get(name)
            .map(|v| PolicyKind::parse(v).map_err(|e| format!("--{name}: {e}")))
            .unwrap_or(Ok(PolicyKind::CacheAware))
    };
    let port = |name: &str, default: u16| -> Result<u16, String> {
        let p: u16 = num(single, name, default)?;
        if p == 0 {
            return Err(format!("--{name} must be 1-65535"));
        }
        Ok(p)
    };
    let max_payload_size: usize = num(single, "max-payload-size", 32 << 20)?;
    if max_payload_size == 0 {
        return Err("--max-payload-size must be positive".into());
    }
    let max_connections: usize = num(single, "max-connections", 1024)?;
    if max_connections == 0 || max_connections > 1_000_000 {
        return Err("--max-connections must be 1-1000000".into());
    }
    let ratio: f64 = num(single, "retry-budget-ratio", 0.2)?;
    if !ratio.is_finite() || !(0.0..=10.0).contains(&ratio) {
        return Err("--retry-budget-ratio must be between 0 and 10".into());
    }
    let cache_threshold: f64 = num(single, "cache-threshold", 0.5)?;
    if !(0.0..=1.0).contains(&cache_threshold) {
        return Err("--cache-threshold must be between 0 and 1".into());
    }
    let eject_after: u32 = num(single, "eject-after", 3)?;
    if eject_after == 0 {
        return Err("--eject-after must be at least 1".into());
    }
    let drain: f64 = num(single, "drain-secs", 30.0)?;
    if !drain.is_finite() || !(0.0..=1e6).contains(&drain) {
        return Err("--drain-secs must be a number of seconds >= 0".into());
    }
    let (prefill_policy, decode_policy, policy) =
        (policy("prefill-policy")?, policy("decode-policy")?, policy("policy")?);
    if decode_policy == PolicyKind::PrecisePrefix {
        return Err("--decode-policy precise_prefix: decode engines publish no KV events the router follows; \
                    pick a decode engine by load (e.g. cache_aware)"
            .into());
    }
    let explicit = num(single, "kv-events", false).map_err(|_| "--kv-events takes true or false".to_string())?;
    // precise_prefix routes by what the events say: it follows them whether or not --kv-events says so.
    let kv_events = explicit || prefill_policy == PolicyKind::PrecisePrefix || policy == PolicyKind::PrecisePrefix;
    Ok(Config {
        host: single.get("host").cloned().unwrap_or_else(|| "127.0.0.1".into()),
        port: port("port", 8001)?,
        metrics_host: single.get("metrics-host").cloned().unwrap_or_else(|| "127.0.0.1".into()),
        metrics_port: port("metrics-port", 29000)?,
        mode,
        engines,
        engine_port: port("engine-port", 8000)?,
        prefill_policy,
        decode_policy,
        policy,
        served_model_name,
        max_payload_size,
        max_connections,
        request_timeout: secs(single, "request-timeout-secs", 1800.0)?,
        drain: Duration::from_secs_f64(drain),
        header_timeout: secs(single, "header-timeout-secs", 10.0)?,
        body_timeout: secs(single, "body-timeout-secs", 60.0)?,
        connect_timeout: millis(single, "connect-timeout-ms", 1000)?,
        first_token_timeout: secs(single, "first-token-timeout-secs", 30.0)?,
        prefill_tokens_per_sec: positive_f64(single, "prefill-tokens-per-sec", 2000.0)?,
        idle_gap_timeout: secs(single, "idle-gap-timeout-secs", 60.0)?,
        max_retries: num(single, "max-retries", 3)?,
        max_migrations: num(single, "max-migrations", 2)?,
        retry_budget_ratio: ratio,
        retry_budget_floor: num(single, "retry-budget-floor", 5)?,
        health_interval: millis(single, "health-interval-ms", 1000)?,
        health_timeout: millis(single, "health-timeout-ms", 2000)?,
        eject_after,
        eject_duration: secs(single, "eject-secs", 10.0)?,
        kube_token_dir: single
            .get("kube-token-dir")
            .cloned()
            .unwrap_or_else(|| "/var/run/secrets/kubernetes.io/serviceaccount".into()),
        cache_threshold,
        balance_abs_threshold: num(single, "balance-abs-threshold", 32)?,
        balance_rel_threshold: positive_f64(single, "balance-rel-threshold", 1.1)?,
        traces: trace_export(single)?,
        kv_events,
        tokenize_timeout: millis(single, "tokenize-timeout-ms", 100)?,
        prompt_ids_cap: num(single, "prompt-ids-cap", 8 << 20)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn pd_by_selectors() {
        let c = parse(&args(
            "--served-model-name m --namespace ns --prefill-selector a=b,role=prefill --decode-selector a=b,role=decode",
        ))
        .map_err(|e| e.to_string());
        let Ok(c) = c else { panic!("{c:?}") };
        match c.engines {
            Engines::Discovery { namespace, prefill: Some(p), .. } => {
                assert_eq!(namespace, "ns");
                assert_eq!(p.query(), "a%3Db%2Crole%3Dprefill");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(c.request_timeout, Duration::from_secs(1800));
    }

    #[test]
    fn precise_prefix_follows_the_kv_events() {
        let base = "--served-model-name m --prefill http://a:1 --decode http://b:2";
        for (extra, follows) in [
            ("", false),
            (" --prefill-policy precise_prefix", true),
            (" --kv-events true", true),
            (" --prefill-policy cache_aware --kv-events false", false),
        ] {
            let c = parse(&args(&format!("{base}{extra}"))).map_err(|e| e.to_string());
            let Ok(c) = c else { panic!("{extra}: {c:?}") };
            assert_eq!(c.kv_events, follows, "{extra}");
        }
    }

    #[test]
    fn refusals_name_the_problem() {
        for (line, needle) in [
            ("--served-model-name m --bogus 1", "unknown flag --bogus"),
            ("--served-model-name m --prefill http://a:1 --decode", "--decode needs a value"),
            ("--served-model-name m --prefill http://a:1", "at least one --prefill and one --decode"),
            ("--served-model-name m --prefill http://a:1 --decode http://b:2 --port x", "not a valid number"),
            ("--served-model-name m --namespace n --prefill-selector a=b", "both --prefill-selector"),
            ("--served-model-name m --prefill http://a:1 --decode http://b:2 --prefill-policy lru", "unknown policy"),
            (
                "--served-model-name m --prefill http://a:1 --decode http://b:2 --decode-policy precise_prefix",
                "decode engines publish no KV events",
            ),
            ("--prefill http://a:1 --decode http://b:2", "--served-model-name is required"),
            ("--served-model-name m --mode aggregated", "needs --selector"),
            ("--served-model-name m --prefill a:1 --decode http://b:2", "must start with http://"),
            ("--served-model-name m --port 1 --port 2 --prefill http://a:1 --decode http://b:2", "given twice"),
            (
                "--served-model-name m --prefill http://a:1 --decode http://b:2 --otlp-traces-endpoint https://c:4318",
                "only http:// is supported",
            ),
            ("--served-model-name m --prefill http://a:1 --decode http://b:2 --trace-sample-ratio 0.5", "needs --otlp"),
            (
                "--served-model-name m --prefill http://a:1 --decode http://b:2 --otlp-traces-endpoint http://c:1/v1/traces --trace-sample-ratio 2",
                "between 0 and 1",
            ),
            (
                "--served-model-name m --prefill http://a:1 --decode http://b:2 --otlp-traces-endpoint http://c:99999/v1/traces",
                "is not a port",
            ),
        ] {
            match parse(&args(line)) {
                Ok(_) => panic!("{line} parsed"),
                Err(e) => assert!(e.contains(needle), "{line}: {e}"),
            }
        }
    }

    #[test]
    fn a_traces_endpoint_is_the_url_spans_are_posted_to() {
        let base = "--served-model-name m --prefill http://a:1 --decode http://b:2 --otlp-traces-endpoint";
        for (url, authority, path) in [
            ("http://otel.monitoring:4318/v1/traces", "otel.monitoring:4318", "/v1/traces"),
            ("http://otel.monitoring:4318", "otel.monitoring:4318", "/v1/traces"),
            ("http://otel.monitoring/", "otel.monitoring:80", "/v1/traces"),
            ("http://[fd00::1]:4318/otlp/v1/traces", "[fd00::1]:4318", "/otlp/v1/traces"),
        ] {
            let c = parse(&args(&format!("{base} {url}"))).map_err(|e| e.to_string());
            let t = c.ok().and_then(|c| c.traces);
            assert!(
                matches!(&t, Some(t) if t.authority == authority && t.path == path && t.sample_ratio == 1.0),
                "{url}: {t:?}"
            );
        }
    }

    #[test]
    fn an_empty_served_name_is_taken_as_the_engines_take_it() {
        let c = parse(&args("--served-model-name= --prefill http://a:1 --decode http://b:2"));
        assert!(matches!(&c, Ok(c) if c.served_model_name.is_empty()), "{:?}", c.err());
        assert!(parse(&args("--served-model-name= --namespace= --prefill http://a:1 --decode http://b:2")).is_err());
    }

    #[test]
    fn engine_urls() {
        assert_eq!(
            parse_engine_url("http://10.0.0.1:8000@3"),
            Ok(StaticEngine { authority: "10.0.0.1:8000".into(), rank: Some(3) })
        );
        assert!(parse_engine_url("http://h:8000/v1").is_err());
        assert!(parse_engine_url("http://h").is_err());
    }
}
