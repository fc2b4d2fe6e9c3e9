//! The engines the router knows: one Endpoint per engine process (a pod's leader), one Worker per
//! data-parallel rank of it. Health is kept per endpoint: active /health probes (fast) and passive
//! outcomes (a breaker: N consecutive failures eject it for a while).

use crate::config::Config;
use crate::metrics::METRICS;
use crate::upstream;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};
use tokio::sync::watch;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Prefill,
    Decode,
    Aggregated,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Self::Prefill => "prefill",
            Self::Decode => "decode",
            Self::Aggregated => "aggregated",
        }
    }
}

#[derive(Debug, Default)]
struct HealthState {
    probe_failures: u32,
    probe_down: bool,
    consecutive_failures: u32,
    ejected_until: Option<Instant>,
}

pub struct Endpoint {
    pub authority: String,
    pub role: Role,
    /// `namespace/name` of the pod, for discovered engines.
    pub pod: Option<String>,
    state: Mutex<HealthState>,
    /// true while the probes say the engine is dead or hung: requests waiting on it give up.
    down: watch::Sender<bool>,
    pub in_flight: AtomicUsize,
    pub removed: AtomicBool,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

pub struct Worker {
    pub id: u64,
    pub endpoint: Arc<Endpoint>,
    pub rank: Option<u32>,
    pub load: AtomicUsize,
    pub label: String,
}

impl Worker {
    pub fn routable(&self) -> bool {
        self.endpoint.routable()
    }
}

impl Endpoint {
    pub fn new(authority: String, role: Role, pod: Option<String>) -> Arc<Self> {
        let (down, _) = watch::channel(false);
        Arc::new(Self {
            authority,
            role,
            pod,
            state: Mutex::new(HealthState::default()),
            down,
            in_flight: AtomicUsize::new(0),
            removed: AtomicBool::new(false),
        })
    }

    pub fn routable(&self) -> bool {
        if self.removed.load(Ordering::Relaxed) {
            return false;
        }
        match self.state.lock() {
            Ok(s) => !s.probe_down && s.ejected_until.is_none_or(|t| Instant::now() >= t),
            Err(_) => false,
        }
    }

    pub fn down_signal(&self) -> watch::Receiver<bool> {
        self.down.subscribe()
    }

    fn publish(&self) {
        let healthy = if self.routable() { 1.0 } else { 0.0 };
        METRICS.set(
            "kimik3_router_engine_healthy",
            &[("role", self.role.name()), ("engine", &self.authority)],
            healthy,
        );
    }

    /// A leg on this engine succeeded (or failed by the client's fault: a 4xx).
    pub fn record_success(&self) {
        if let Ok(mut s) = self.state.lock() {
            s.consecutive_failures = 0;
        }
    }

    /// A leg failed by the engine's fault (connect, 5xx, reset, watchdog, a stream broken after its 200).
    pub fn record_failure(&self, cfg: &Config) {
        let ejected = match self.state.lock() {
            Ok(mut s) => {
                s.consecutive_failures += 1;
                let now = Instant::now();
                let already = s.ejected_until.is_some_and(|t| now < t);
                if s.consecutive_failures >= cfg.eject_after && !already {
                    s.ejected_until = Some(now + cfg.eject_duration);
                    // Half-open after the ejection: the next failure ejects it again at once.
                    s.consecutive_failures = cfg.eject_after.saturating_sub(1);
                    true
                } else {
                    false
                }
            }
            Err(_) => false,
        };
        if ejected {
            crate::warn!(
                "ejecting {} engine {} for {:?} after {} consecutive failures",
                self.role.name(),
                self.authority,
                cfg.eject_duration,
                cfg.eject_after
            );
            METRICS.inc(
                "kimik3_router_engine_ejections_total",
                &[("role", self.role.name()), ("engine", &self.authority)],
            );
        }
        self.publish();
    }

    /// One active probe's outcome. `definitive`: the connect was refused (nobody listens).
    pub fn record_probe(&self, ok: bool, definitive: bool) {
        let (was, now_down) = match self.state.lock() {
            Ok(mut s) => {
                let was = s.probe_down;
                if ok {
                    s.probe_failures = 0;
                    s.probe_down = false;
                } else {
                    s.probe_failures += 1;
                    if definitive || s.probe_failures >= 2 {
                        s.probe_down = true;
                    }
                }
                (was, s.probe_down)
            }
            Err(_) => return,
        };
        if was != now_down {
            if now_down {
                crate::warn!("{} engine {} failed its health probes: unrouted", self.role.name(), self.authority);
            } else {
                crate::info!("{} engine {} answers its health probes: routable", self.role.name(), self.authority);
            }
            let _ = self.down.send_replace(now_down);
        }
        self.publish();
    }
}

/// The engines of one role.
pub struct Pool {
    pub role: Role,
    workers: RwLock<Arc<Vec<Arc<Worker>>>>,
}

impl Pool {
    fn new(role: Role) -> Self {
        Self { role, workers: RwLock::new(Arc::new(Vec::new())) }
    }

    pub fn snapshot(&self) -> Arc<Vec<Arc<Worker>>> {
        self.workers.read().map(|w| w.clone()).unwrap_or_default()
    }

    pub fn routable_count(&self) -> usize {
        self.snapshot().iter().filter(|w| w.routable()).count()
    }

    pub fn insert(&self, endpoint: &Arc<Endpoint>, ranks: &[Option<u32>]) {
        let new: Vec<Arc<Worker>> = ranks
            .iter()
            .map(|rank| {
                Arc::new(Worker {
                    id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
                    endpoint: endpoint.clone(),
                    rank: *rank,
                    load: AtomicUsize::new(0),
                    label: match rank {
                        Some(r) => format!("{}@{r}", endpoint.authority),
                        None => endpoint.authority.clone(),
                    },
                })
            })
            .collect();
        if let Ok(mut w) = self.workers.write() {
            let mut list: Vec<Arc<Worker>> =
                w.iter().filter(|x| !Arc::ptr_eq(&x.endpoint, endpoint)).cloned().collect();
            list.extend(new);
            list.sort_by(|a, b| a.label.cmp(&b.label));
            *w = Arc::new(list);
        }
        endpoint.publish();
        self.publish_count();
    }

    pub fn remove(&self, endpoint: &Arc<Endpoint>) {
        endpoint.removed.store(true, Ordering::Relaxed);
        if let Ok(mut w) = self.workers.write() {
            let list: Vec<Arc<Worker>> = w.iter().filter(|x| !Arc::ptr_eq(&x.endpoint, endpoint)).cloned().collect();
            *w = Arc::new(list);
        }
        let still_used = self.snapshot().iter().any(|w| w.endpoint.authority == endpoint.authority);
        if !still_used {
            METRICS.forget_engine(&endpoint.authority);
        }
        self.publish_count();
    }

    pub fn publish_count(&self) {
        METRICS.set("kimik3_router_engines", &[("role", self.role.name())], self.routable_count() as f64);
    }
}

pub struct Registry {
    pub prefill: Pool,
    pub decode: Pool,
    pub aggregated: Pool,
    /// What the prefill (and aggregated) engines' caches hold, from their KV events (kv_events.rs).
    pub kv: Arc<crate::kv_events::KvIndex>,
}

impl Registry {
    pub fn new() -> Self {
        Self {
            prefill: Pool::new(Role::Prefill),
            decode: Pool::new(Role::Decode),
            aggregated: Pool::new(Role::Aggregated),
            kv: Arc::default(),
        }
    }

    pub fn pool(&self, role: Role) -> &Pool {
        match role {
            Role::Prefill => &self.prefill,
            Role::Decode => &self.decode,
            Role::Aggregated => &self.aggregated,
        }
    }
}

impl Default for Registry {
    fn default() -> Self {
        Self::new()
    }
}

/// The data-parallel ranks an engine serves: the distinct `engine` label values of its `vllm:`
/// metrics (as vllm-router reads them); one worker per rank, none if it reports no such label.
pub fn ranks_from_metrics(body: &str) -> Vec<Option<u32>> {
    let mut found = BTreeSet::new();
    for line in body.lines().filter(|l| l.starts_with("vllm:")) {
        if let Some((_, rest)) = line.split_once("engine=\"") {
            if let Some((value, _)) = rest.split_once('"') {
                found.insert(value.to_string());
            }
        }
    }
    if found.len() <= 1 {
        return vec![None];
    }
    let numeric: Option<BTreeSet<u32>> = found.iter().map(|v| v.parse::<u32>().ok()).collect();
    match numeric {
        Some(ranks) => ranks.into_iter().map(Some).collect(),
        None => (0..found.len() as u32).map(Some).collect(),
    }
}

/// Bring an engine into its pool: wait (without blocking any other add) until it answers /health,
/// read its ranks, insert one worker per rank and keep probing it until it is removed.
/// `is_current` says whether the add is still wanted (the pod may have gone meanwhile).
pub async fn admit(
    cfg: Arc<Config>,
    reg: Arc<Registry>,
    endpoint: Arc<Endpoint>,
    fixed_rank: Option<u32>,
    is_current: impl Fn() -> bool,
) {
    let pool = reg.pool(endpoint.role);
    let mut wait = Duration::from_millis(100);
    loop {
        if endpoint.removed.load(Ordering::Relaxed) || !is_current() {
            return;
        }
        match upstream::get(&endpoint.authority, "/health", cfg.health_timeout).await {
            Ok((200, _)) => break,
            Ok((status, _)) => crate::debug!("engine {} /health says {status}; waiting", endpoint.authority),
            Err(e) => crate::debug!("engine {} not answering yet: {e}", endpoint.authority),
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(Duration::from_secs(1));
    }
    let ranks = match fixed_rank {
        Some(r) => vec![Some(r)],
        None => match upstream::get(&endpoint.authority, "/metrics", cfg.health_timeout).await {
            Ok((200, body)) => ranks_from_metrics(&String::from_utf8_lossy(&body)),
            _ => vec![None],
        },
    };
    if endpoint.removed.load(Ordering::Relaxed) || !is_current() {
        return;
    }
    crate::info!("{} engine {} routable with {} worker(s)", pool.role.name(), endpoint.authority, ranks.len());
    pool.insert(&endpoint, &ranks);
    METRICS.declare(
        "kimik3_router_engine_ejections_total",
        &[("role", pool.role.name()), ("engine", &endpoint.authority)],
    );
    METRICS.inc("kimik3_router_discovery_events_total", &[("event", "engine_added")]);
    if cfg.kv_events && endpoint.role != Role::Decode {
        tokio::spawn(crate::kv_events::follow(cfg.clone(), reg.kv.clone(), endpoint.clone()));
    }
    tokio::spawn(probe_loop(cfg, reg.clone(), endpoint));
}

async fn probe_loop(cfg: Arc<Config>, reg: Arc<Registry>, endpoint: Arc<Endpoint>) {
    loop {
        tokio::time::sleep(cfg.health_interval).await;
        if endpoint.removed.load(Ordering::Relaxed) {
            return;
        }
        let deadline = cfg.health_timeout.min(cfg.health_interval.max(Duration::from_millis(500)));
        let (ok, definitive) = match upstream::get(&endpoint.authority, "/health", deadline).await {
            Ok((200, _)) => (true, false),
            Ok(_) => (false, false),
            Err(e) => (false, e.contains("Connection refused") || e.contains("refused")),
        };
        endpoint.record_probe(ok, definitive);
        reg.pool(endpoint.role).publish_count();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_are_the_engine_labels() {
        let body = "# HELP x\nvllm:num_requests_running{engine=\"0\",model_name=\"m\"} 1\n\
                    vllm:num_requests_running{engine=\"1\",model_name=\"m\"} 2\nother{engine=\"7\"} 1\n";
        assert_eq!(ranks_from_metrics(body), vec![Some(0), Some(1)]);
        assert_eq!(ranks_from_metrics("vllm:x{engine=\"0\"} 1\n"), vec![None]);
        assert_eq!(ranks_from_metrics(""), vec![None]);
    }
}
