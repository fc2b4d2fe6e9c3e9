//! Load-balancing policies, same names and meaning as vllm-router 0.1.17's (re-implemented):
//! - cache_aware: prefix affinity from request history (an approximate index of the prompts each
//!   worker was given), unless the load is imbalanced; below `cache_threshold` match, least loaded.
//! - round_robin: the next candidate in turn.
//! - consistent_hash: a hash ring (160 virtual nodes per worker) over the session key; when the
//!   target cannot take the request, the next worker on the ring.
//! - sticky_least_loaded: a session stays on its worker; a new session goes to the worker with the
//!   fewest active sessions (ties by rendezvous hash); sessions expire after 2 h.
//! - random.
//!
//! Session key: the first non-empty of the headers x-session-id, x-user-id, x-tenant-id,
//! x-correlation-id, x-request-id, x-trace-id, then the body's session_params.session_id, user,
//! session_id, user_id (strings, or numbers).

use crate::config::{Config, PolicyKind};
use crate::engines::{Role, Worker};
use crate::kv_events::KvIndex;
use crate::metrics::METRICS;
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const SESSION_HEADERS: &[&str] =
    &["x-session-id", "x-user-id", "x-tenant-id", "x-correlation-id", "x-request-id", "x-trace-id"];

const BLOCK: usize = 256;
const MAX_BLOCKS: usize = 1 << 19;
const VIRTUAL_NODES: u32 = 160;
const SESSION_TTL: Duration = Duration::from_secs(7200);

pub fn fnv(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x100000001b3);
    }
    mix(h)
}

/// A block's hash, eight bytes a step (FNV's multiply over words, then `mix`): the prefix index
/// hashes every prompt twice per request (prefill and decode picks), so byte-wise FNV's cost counts.
fn block_hash(block: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325 ^ block.len() as u64;
    let mut words = block.chunks_exact(8);
    for w in &mut words {
        let mut b = [0u8; 8];
        b.copy_from_slice(w);
        h = (h ^ u64::from_le_bytes(b)).wrapping_mul(0x100000001b3);
    }
    for b in words.remainder() {
        h = (h ^ u64::from(*b)).wrapping_mul(0x100000001b3);
    }
    mix(h)
}

fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51afd7ed558ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ceb9fe1a85ec53);
    x ^ (x >> 33)
}

/// The session key of a request, in vllm-router's order; None when it carries none.
pub fn session_key(headers: &http::HeaderMap, body: &Map<String, Value>) -> Option<String> {
    for name in SESSION_HEADERS {
        if let Some(v) = headers.get(*name).and_then(|v| v.to_str().ok()) {
            if !v.is_empty() {
                return Some(format!("header:{name}:{v}"));
            }
        }
    }
    let id = |v: Option<&Value>| match v {
        Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
        Some(Value::Number(n)) => Some(n.to_string()),
        _ => None,
    };
    if let Some(s) = id(body.get("session_params").and_then(|p| p.get("session_id"))) {
        return Some(format!("session:{s}"));
    }
    if let Some(s) = id(body.get("user")) {
        return Some(format!("user:{s}"));
    }
    if let Some(s) = id(body.get("session_id")) {
        return Some(format!("session:{s}"));
    }
    id(body.get("user_id")).map(|s| format!("user:{s}"))
}

/// What a policy may look at for one request.
pub struct RouteInput<'a> {
    pub session: Option<&'a str>,
    /// The prompt's text (chat: the messages as JSON; completions: the prompt): the prefix key.
    pub prefix: &'a [u8],
    /// The prompt's token ids, when known (precise_prefix).
    pub ids: Option<&'a [u64]>,
    /// The engines' caches as their KV events tell (precise_prefix).
    pub kv: Option<&'a KvIndex>,
}

#[derive(Default)]
struct PrefixIndex {
    /// chained block hash -> (worker id, last use tick)
    blocks: HashMap<u64, Vec<(u64, u64)>>,
    entries: usize,
    /// Entries per worker id: a miss goes to the least loaded, ties to the one holding least (as
    /// vllm-router sends a miss to its smallest tree), so an idle fleet is spread, not filled in order.
    held: HashMap<u64, usize>,
    tick: u64,
}

impl PrefixIndex {
    fn chain(prefix: &[u8]) -> Vec<u64> {
        let mut out = Vec::with_capacity(prefix.len() / BLOCK + 1);
        let mut h: u64 = 0x9e3779b97f4a7c15;
        for block in prefix.chunks(BLOCK) {
            h = mix(h ^ block_hash(block));
            out.push(h);
        }
        out
    }

    /// Blocks matched from the start, per candidate worker id.
    fn matches(&self, chain: &[u64], ids: &[u64]) -> Vec<usize> {
        let mut matched = vec![0usize; ids.len()];
        let mut alive: Vec<usize> = (0..ids.len()).collect();
        for (i, h) in chain.iter().enumerate() {
            let Some(holders) = self.blocks.get(h) else {
                break;
            };
            alive.retain(|&c| ids.get(c).is_some_and(|id| holders.iter().any(|(w, _)| w == id)));
            if alive.is_empty() {
                break;
            }
            for &c in &alive {
                if let Some(m) = matched.get_mut(c) {
                    *m = i + 1;
                }
            }
        }
        matched
    }

    fn insert(&mut self, chain: &[u64], worker: u64) {
        self.tick += 1;
        let tick = self.tick;
        for h in chain {
            let holders = self.blocks.entry(*h).or_default();
            match holders.iter_mut().find(|(w, _)| *w == worker) {
                Some(e) => e.1 = tick,
                None => {
                    holders.push((worker, tick));
                    self.entries += 1;
                    *self.held.entry(worker).or_default() += 1;
                }
            }
        }
        if self.entries > MAX_BLOCKS {
            self.evict();
        }
    }

    /// Drop the older half of the entries (LRU by last use).
    fn evict(&mut self) {
        let mut ticks: Vec<u64> = self.blocks.values().flat_map(|v| v.iter().map(|(_, t)| *t)).collect();
        ticks.sort_unstable();
        let cut = ticks.get(ticks.len() / 2).copied().unwrap_or(0);
        let mut entries = 0;
        let mut held: HashMap<u64, usize> = HashMap::new();
        self.blocks.retain(|_, v| {
            v.retain(|(_, t)| *t > cut);
            entries += v.len();
            for (w, _) in v.iter() {
                *held.entry(*w).or_default() += 1;
            }
            !v.is_empty()
        });
        self.entries = entries;
        self.held = held;
    }
}

type Ring = (Vec<u64>, Vec<(u64, u64)>);

struct Sessions {
    sessions: HashMap<String, (String, Instant)>,
    active: HashMap<String, usize>,
    last_sweep: Instant,
}

pub struct Policy {
    pub kind: PolicyKind,
    role: Role,
    counter: AtomicUsize,
    index: Mutex<PrefixIndex>,
    /// (worker ids the ring was built for, sorted (point, worker id))
    ring: Mutex<Ring>,
    sessions: Mutex<Sessions>,
    cache_threshold: f64,
    balance_abs: usize,
    balance_rel: f64,
    rng: AtomicU64,
}

impl Policy {
    pub fn new(kind: PolicyKind, role: Role, cfg: &Config, seed: u64) -> Self {
        Self {
            kind,
            role,
            counter: AtomicUsize::new(0),
            index: Mutex::new(PrefixIndex::default()),
            ring: Mutex::new((Vec::new(), Vec::new())),
            sessions: Mutex::new(Sessions {
                sessions: HashMap::new(),
                active: HashMap::new(),
                last_sweep: Instant::now(),
            }),
            cache_threshold: cfg.cache_threshold,
            balance_abs: cfg.balance_abs_threshold,
            balance_rel: cfg.balance_rel_threshold,
            rng: AtomicU64::new(seed | 1),
        }
    }

    pub fn next_random(&self) -> u64 {
        let x = self.rng.fetch_add(0x9e3779b97f4a7c15, Ordering::Relaxed);
        mix(x)
    }

    /// Pick one of `candidates` (routable, not yet tried); `all` is the whole pool (the ring's domain).
    pub fn select(
        &self,
        all: &[Arc<Worker>],
        candidates: &[Arc<Worker>],
        input: &RouteInput<'_>,
    ) -> Option<Arc<Worker>> {
        if candidates.is_empty() {
            return None;
        }
        let pick = match self.kind {
            PolicyKind::RoundRobin => {
                let n = self.counter.fetch_add(1, Ordering::Relaxed);
                candidates.get(n % candidates.len())
            }
            PolicyKind::Random => candidates.get((self.next_random() % candidates.len() as u64) as usize),
            PolicyKind::ConsistentHash => self.consistent(all, candidates, input),
            PolicyKind::StickyLeastLoaded => self.sticky(candidates, input),
            PolicyKind::CacheAware => self.cache_aware(candidates, input),
            // Without token ids or an index of any candidate: the approximate policy.
            PolicyKind::PrecisePrefix => {
                self.precise(candidates, input).or_else(|| self.cache_aware(candidates, input))
            }
        };
        pick.cloned()
    }

    fn consistent<'a>(
        &self,
        all: &[Arc<Worker>],
        candidates: &'a [Arc<Worker>],
        input: &RouteInput<'_>,
    ) -> Option<&'a Arc<Worker>> {
        let key = match input.session {
            Some(s) => s.to_string(),
            None if input.prefix.len() > 100 => format!("request_hash:{:016x}", fnv(input.prefix)),
            None => format!("request:{}", String::from_utf8_lossy(input.prefix)),
        };
        let h = fnv(key.as_bytes());
        let Ok(mut ring) = self.ring.lock() else {
            return candidates.first();
        };
        let ids: Vec<u64> = all.iter().map(|w| w.id).collect();
        if ring.0 != ids {
            let mut points: Vec<(u64, u64)> = Vec::with_capacity(all.len() * VIRTUAL_NODES as usize);
            for w in all {
                for i in 0..VIRTUAL_NODES {
                    points.push((fnv(format!("{}:{i}", w.label).as_bytes()), w.id));
                }
            }
            points.sort_unstable();
            *ring = (ids, points);
        }
        let points = &ring.1;
        let start = points.partition_point(|(p, _)| *p < h);
        for i in 0..points.len() {
            if let Some((_, id)) = points.get((start + i) % points.len()) {
                if let Some(w) = candidates.iter().find(|w| w.id == *id) {
                    return Some(w);
                }
            }
        }
        candidates.first()
    }

    fn sticky<'a>(&self, candidates: &'a [Arc<Worker>], input: &RouteInput<'_>) -> Option<&'a Arc<Worker>> {
        let Ok(mut st) = self.sessions.lock() else {
            return candidates.first();
        };
        let now = Instant::now();
        if now.duration_since(st.last_sweep) > Duration::from_secs(60) {
            st.last_sweep = now;
            let expired: Vec<(String, String)> = st
                .sessions
                .iter()
                .filter(|(_, (_, t))| now.duration_since(*t) >= SESSION_TTL)
                .map(|(k, (w, _))| (k.clone(), w.clone()))
                .collect();
            for (k, w) in expired {
                st.sessions.remove(&k);
                if let Some(c) = st.active.get_mut(&w) {
                    *c = c.saturating_sub(1);
                }
            }
        }
        let least = |st: &Sessions, tie: &str| -> Option<&'a Arc<Worker>> {
            let min = candidates.iter().map(|w| st.active.get(&w.label).copied().unwrap_or(0)).min()?;
            candidates
                .iter()
                .filter(|w| st.active.get(&w.label).copied().unwrap_or(0) == min)
                .max_by_key(|w| fnv(format!("{tie}:{}", w.label).as_bytes()))
        };
        let Some(session) = input.session else {
            let tie = String::from_utf8_lossy(input.prefix);
            return least(&st, &tie);
        };
        if let Some((label, t)) = st.sessions.get(session).cloned() {
            let fresh = now.duration_since(t) < SESSION_TTL;
            if let Some(w) = candidates.iter().find(|w| w.label == label).filter(|_| fresh) {
                if let Some(e) = st.sessions.get_mut(session) {
                    e.1 = now;
                }
                return Some(w);
            }
            st.sessions.remove(session);
            if let Some(c) = st.active.get_mut(&label) {
                *c = c.saturating_sub(1);
            }
        }
        let w = least(&st, session)?;
        st.sessions.insert(session.to_string(), (w.label.clone(), now));
        *st.active.entry(w.label.clone()).or_insert(0) += 1;
        Some(w)
    }

    /// The candidate (engine, rank) holding the longest true K3 hit by its KV events (ties below);
    /// under a load imbalance the least loaded. None when no candidate's cache is known or the
    /// prompt's ids are not: the caller routes approximately then.
    fn precise<'a>(&self, candidates: &'a [Arc<Worker>], input: &RouteInput<'_>) -> Option<&'a Arc<Worker>> {
        let (kv, ids) = (input.kv?, input.ids?);
        let keys: Vec<(&str, u32)> =
            candidates.iter().map(|w| (w.endpoint.authority.as_str(), w.rank.unwrap_or(0))).collect();
        let hits = kv.hits(&keys, ids);
        let best = hits.iter().flatten().map(|h| h.tokens).max()?;
        let loads: Vec<usize> = candidates.iter().map(|w| w.load.load(Ordering::Relaxed)).collect();
        let min = loads.iter().copied().min().unwrap_or(0);
        let max = loads.iter().copied().max().unwrap_or(0);
        let imbalanced = max.saturating_sub(min) > self.balance_abs && (max as f64) > (min as f64) * self.balance_rel;
        // Among equal K3 hits: the least loaded; then the rank already holding most of the prompt's
        // MLA blocks (sent elsewhere, they would be stored a second time and push out what other
        // sessions need next: a session whose KDA state was evicted goes back to its blocks); then
        // the emptiest cache. A rank that has published nothing yet is empty as far as anyone knows.
        // Full caches all hold about as many blocks: what is still tied goes round, or every new
        // session would land on the first candidate and thrash its cache.
        let held = kv.held(&keys);
        let hit = |i: usize| hits.get(i).copied().flatten().unwrap_or_default();
        let order = |i: usize| {
            let load = loads.get(i).copied().unwrap_or(usize::MAX);
            (load, std::cmp::Reverse(hit(i).mla_tokens), held.get(i).copied().unwrap_or(0))
        };
        let eligible: Vec<usize> = (0..candidates.len()).filter(|&i| imbalanced || hit(i).tokens == best).collect();
        let first = eligible.iter().map(|&i| order(i)).min()?;
        let tied: Vec<usize> = eligible.into_iter().filter(|&i| order(i) == first).collect();
        let position = *tied.get(self.counter.fetch_add(1, Ordering::Relaxed) % tied.len())?;
        let decision = if imbalanced {
            "load_imbalance"
        } else if best > 0 {
            "prefix_hit"
        } else {
            "prefix_miss"
        };
        METRICS
            .inc("kimik3_router_prefix_routing_decisions_total", &[("role", self.role.name()), ("decision", decision)]);
        let chosen = candidates.get(position)?;
        if let Some(hit) = hits.get(position).copied().flatten() {
            METRICS.add("kimik3_router_prefix_hit_tokens_total", &[("role", self.role.name())], hit.tokens as f64);
        }
        METRICS.add("kimik3_router_prefix_prompt_tokens_total", &[("role", self.role.name())], ids.len() as f64);
        Some(chosen)
    }

    fn cache_aware<'a>(&self, candidates: &'a [Arc<Worker>], input: &RouteInput<'_>) -> Option<&'a Arc<Worker>> {
        let loads: Vec<usize> = candidates.iter().map(|w| w.load.load(Ordering::Relaxed)).collect();
        let min = loads.iter().copied().min().unwrap_or(0);
        let max = loads.iter().copied().max().unwrap_or(0);
        let imbalanced = max.saturating_sub(min) > self.balance_abs && (max as f64) > (min as f64) * self.balance_rel;
        let chain = PrefixIndex::chain(input.prefix);
        let Ok(mut index) = self.index.lock() else {
            return candidates.first();
        };
        let ids: Vec<u64> = candidates.iter().map(|w| w.id).collect();
        let matched = if imbalanced || chain.is_empty() { vec![0; ids.len()] } else { index.matches(&chain, &ids) };
        let best = matched.iter().copied().max().unwrap_or(0);
        let rate = if chain.is_empty() { 0.0 } else { best as f64 / chain.len() as f64 };
        let use_prefix = !imbalanced && rate > self.cache_threshold;
        let held = |i: usize| candidates.get(i).and_then(|w| index.held.get(&w.id)).copied().unwrap_or(0);
        let position = (0..candidates.len())
            .filter(|&i| !use_prefix || matched.get(i) == Some(&best))
            .min_by_key(|&i| (loads.get(i).copied().unwrap_or(usize::MAX), held(i)))?;
        let chosen = candidates.get(position)?;
        index.insert(&chain, chosen.id);
        drop(index);
        let decision = if imbalanced {
            "load_imbalance"
        } else if use_prefix {
            "prefix_hit"
        } else {
            "prefix_miss"
        };
        METRICS
            .inc("kimik3_router_prefix_routing_decisions_total", &[("role", self.role.name()), ("decision", decision)]);
        Some(chosen)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engines::{Endpoint, Pool, Registry};
    use crate::kv_events::KvIndex;

    fn cfg() -> Config {
        let args: Vec<String> = "--served-model-name m --prefill http://a:1 --decode http://b:2"
            .split_whitespace()
            .map(String::from)
            .collect();
        crate::config::parse(&args).unwrap_or_else(|e| panic!("{e}"))
    }

    fn workers(n: usize) -> Vec<Arc<Worker>> {
        let reg = Registry::new();
        let pool: &Pool = &reg.decode;
        for i in 0..n {
            pool.insert(&Endpoint::new(format!("10.0.0.{i}:8000"), Role::Decode, None), &[None]);
        }
        pool.snapshot().to_vec()
    }

    #[test]
    fn precise_prefix_breaks_ties_by_the_prompts_blocks_then_the_emptiest_rank() {
        let c = cfg();
        let ws = workers(3);
        let p = Policy::new(PolicyKind::PrecisePrefix, Role::Decode, &c, 1);
        let kv = KvIndex::default();
        // 10.0.0.0 published and holds blocks, 10.0.0.1 published and holds fewer, 10.0.0.2 nothing yet.
        let _ = kv.with("10.0.0.0:8000", 0, |r| {
            r.block_size = Some(4);
            r.mla.extend([1, 2, 3]);
            r.kda.insert(3);
        });
        let _ = kv.with("10.0.0.1:8000", 0, |r| {
            r.block_size = Some(4);
            r.mla.insert(9);
        });
        let ids: Vec<u64> = (100..120).collect(); // a prompt no rank holds
        let input = RouteInput { session: None, prefix: b"p", ids: Some(&ids), kv: Some(&kv) };
        assert_eq!(p.select(&ws, &ws, &input).map(|w| w.endpoint.authority.clone()).as_deref(), Some("10.0.0.2:8000"));
        // A prompt whose blocks a rank holds (with a KDA state at the end of the first) goes there.
        let cached: Vec<u64> = (0..9).collect();
        let chain = crate::kv_events::block_hashes(&cached, 4);
        let _ = kv.with("10.0.0.1:8000", 0, |r| {
            r.mla.insert(chain[0]);
            r.kda.insert(chain[0]);
        });
        let input = RouteInput { session: None, prefix: b"p", ids: Some(&cached), kv: Some(&kv) };
        assert_eq!(p.select(&ws, &ws, &input).map(|w| w.endpoint.authority.clone()).as_deref(), Some("10.0.0.1:8000"));
        // No K3 hit anywhere, but one rank holds the prompt's MLA blocks (its KDA state was evicted):
        // there, not to the emptiest, so the blocks are not stored twice.
        let other: Vec<u64> = (200..209).collect();
        let chain = crate::kv_events::block_hashes(&other, 4);
        let _ = kv.with("10.0.0.0:8000", 0, |r| r.mla.extend(chain.iter().take(2)));
        let input = RouteInput { session: None, prefix: b"p", ids: Some(&other), kv: Some(&kv) };
        assert_eq!(p.select(&ws, &ws, &input).map(|w| w.endpoint.authority.clone()).as_deref(), Some("10.0.0.0:8000"));
    }

    #[test]
    fn session_key_order() {
        let mut h = http::HeaderMap::new();
        let body: Map<String, Value> =
            serde_json::from_str(r#"{"user":"u1","session_params":{"session_id":"s1"}}"#).unwrap_or_default();
        assert_eq!(session_key(&h, &body).as_deref(), Some("session:s1"));
        h.insert("x-request-id", http::HeaderValue::from_static("r"));
        h.insert("x-user-id", http::HeaderValue::from_static("u"));
        assert_eq!(session_key(&h, &body).as_deref(), Some("header:x-user-id:u"));
        h.insert("x-session-id", http::HeaderValue::from_static(""));
        assert_eq!(session_key(&h, &body).as_deref(), Some("header:x-user-id:u"));
        let body: Map<String, Value> = serde_json::from_str(r#"{"user_id":7}"#).unwrap_or_default();
        assert_eq!(session_key(&http::HeaderMap::new(), &body).as_deref(), Some("user:7"));
    }

    #[test]
    fn cache_aware_follows_the_prefix_and_balances_misses() {
        let c = cfg();
        let ws = workers(3);
        let p = Policy::new(PolicyKind::CacheAware, Role::Decode, &c, 1);
        let long = "x".repeat(4000);
        let input = RouteInput { session: None, prefix: long.as_bytes(), ids: None, kv: None };
        let first = p.select(&ws, &ws, &input).map(|w| w.id);
        // Another worker is busier-free now: the same prompt still goes where its prefix is.
        if let Some(w) = ws.iter().find(|w| Some(w.id) == first) {
            w.load.store(3, Ordering::Relaxed);
        }
        let longer = format!("{long}yyyy");
        let again = p.select(&ws, &ws, &RouteInput { session: None, prefix: longer.as_bytes(), ids: None, kv: None });
        assert_eq!(again.map(|w| w.id), first);
        // A different prompt goes to the least loaded one.
        let other = "z".repeat(4000);
        let miss = p.select(&ws, &ws, &RouteInput { session: None, prefix: other.as_bytes(), ids: None, kv: None });
        assert_ne!(miss.map(|w| w.id), first);
    }

    #[test]
    fn cache_aware_spreads_misses_over_an_idle_fleet() {
        // Unrelated prompts, nothing in flight: each worker in turn (the one holding least), not
        // the first one every time.
        let c = cfg();
        let ws = workers(3);
        let p = Policy::new(PolicyKind::CacheAware, Role::Decode, &c, 1);
        let picked: std::collections::HashSet<u64> = (0..3)
            .filter_map(|i| {
                let prompt = format!("{i}").repeat(2000);
                p.select(&ws, &ws, &RouteInput { session: None, prefix: prompt.as_bytes(), ids: None, kv: None })
                    .map(|w| w.id)
            })
            .collect();
        assert_eq!(picked.len(), 3, "{picked:?}");
    }

    #[test]
    fn consistent_hash_is_stable_and_skips_unavailable_targets() {
        let c = cfg();
        let ws = workers(4);
        let p = Policy::new(PolicyKind::ConsistentHash, Role::Decode, &c, 1);
        let input = RouteInput { session: Some("header:x-session-id:abc"), prefix: b"", ids: None, kv: None };
        let a = p.select(&ws, &ws, &input).map(|w| w.id);
        assert_eq!(p.select(&ws, &ws, &input).map(|w| w.id), a);
        let rest: Vec<Arc<Worker>> = ws.iter().filter(|w| Some(w.id) != a).cloned().collect();
        let b = p.select(&ws, &rest, &input).map(|w| w.id);
        assert!(b.is_some() && b != a);
        let mut seen = std::collections::HashSet::new();
        for i in 0..200 {
            let key = format!("header:x-session-id:{i}");
            let input = RouteInput { session: Some(&key), prefix: b"", ids: None, kv: None };
            seen.insert(p.select(&ws, &ws, &input).map(|w| w.id));
        }
        assert_eq!(seen.len(), 4);
    }

    #[test]
    fn sticky_least_loaded_keeps_sessions_and_spreads_new_ones() {
        let c = cfg();
        let ws = workers(2);
        let p = Policy::new(PolicyKind::StickyLeastLoaded, Role::Decode, &c, 1);
        let pick = |s: &str| {
            p.select(&ws, &ws, &RouteInput { session: Some(s), prefix: b"", ids: None, kv: None }).map(|w| w.id)
        };
        let a = pick("a");
        let b = pick("b");
        assert_ne!(a, b);
        assert_eq!(pick("a"), a);
        assert_eq!(pick("b"), b);
    }
}
