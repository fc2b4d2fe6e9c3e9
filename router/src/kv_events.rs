//! What each prefill engine's cache holds, per data-parallel rank and KV cache group, kept from the
//! engines' own KV events (vLLM 0.33.0's publisher: docs/vllm-facts.md §5b, docs/kv-events.md).
//!
//! On an engine's add the router reads its `GET /kv_event_sources` (every rank's publisher; the
//! endpoints are wildcards: the host is the engine's) and subscribes to each rank (zmtp.rs). Each
//! batch carries a sequence number: the next one expected is applied; a gap is filled from the
//! rank's replay socket; what a replay cannot fill, or a sequence that starts again (the engine
//! restarted), clears what was known of that rank, so the index only ever under-states a cache,
//! never claims a block the engine dropped. A lost connection clears it too until it is back.
//!
//! Blocks are the events' 64-bit hashes: group `mla_attention` (K3's MLA blocks) and `mamba` (its
//! KDA states, stored only where the engine keeps a state).

use crate::config::Config;
use crate::engines::Endpoint;
use crate::metrics::METRICS;
use crate::msgpack::{Mp, decode};
use crate::zmtp::Socket;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Outcomes counted in kimik3_router_kv_events_total.
pub const KV_EVENT_OUTCOMES: &[&str] =
    &["applied", "replayed", "gap_cleared", "restart_cleared", "disconnected", "undecodable"];

/// One rank's known blocks.
#[derive(Default, Debug)]
pub struct RankIndex {
    pub mla: HashSet<u64>,
    pub kda: HashSet<u64>,
    next: Option<u64>,
    /// The engine's block size, from its BlockStored events.
    pub block_size: Option<usize>,
}

/// The first block's parent: sha256 over the CBOR text "vllm-none-hash" (vLLM's init_none_hash
/// with PYTHONHASHSEED unset, which the operator never sets).
fn none_hash() -> [u8; 32] {
    let mut cbor = vec![0x60 + 14];
    cbor.extend_from_slice(b"vllm-none-hash");
    sha256(&cbor)
}

fn sha256(data: &[u8]) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, data);
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

fn cbor_uint(out: &mut Vec<u8>, major: u8, v: u64) {
    let m = major << 5;
    match v {
        0..=23 => out.push(m | v as u8),
        24..=0xff => out.extend_from_slice(&[m | 24, v as u8]),
        0x100..=0xffff => {
            out.push(m | 25);
            out.extend_from_slice(&(v as u16).to_be_bytes());
        }
        0x1_0000..=0xffff_ffff => {
            out.push(m | 26);
            out.extend_from_slice(&(v as u32).to_be_bytes());
        }
        _ => {
            out.push(m | 27);
            out.extend_from_slice(&v.to_be_bytes());
        }
    }
}

/// The event hashes (low 64 bits) of a prompt's full blocks: vLLM's sha256_cbor chain
/// `sha256(cbor((parent, tuple(block_ids), None)))` (vllm/v1/core/kv_cache_utils.py hash_block_tokens,
/// canonical CBOR: a 3-array of the parent's 32 bytes, the ids, null).
pub fn block_hashes(ids: &[u64], block: usize) -> Vec<u64> {
    let mut parent = none_hash();
    let mut out = Vec::with_capacity(ids.len() / block.max(1));
    if block == 0 {
        return out;
    }
    let mut cbor = Vec::with_capacity(block * 5 + 48);
    for chunk in ids.chunks_exact(block) {
        cbor.clear();
        cbor.push(0x83);
        cbor_uint(&mut cbor, 2, 32);
        cbor.extend_from_slice(&parent);
        cbor_uint(&mut cbor, 4, chunk.len() as u64);
        for id in chunk {
            cbor_uint(&mut cbor, 0, *id);
        }
        cbor.push(0xf6);
        parent = sha256(&cbor);
        let mut low = [0u8; 8];
        low.copy_from_slice(&parent[24..]);
        out.push(u64::from_be_bytes(low));
    }
    out
}

/// A prompt's hit on one rank.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Hit {
    /// The true K3 hit: prompt tokens the engine will not compute.
    pub tokens: usize,
    /// The MLA blocks it holds from the start, in tokens, KDA state or not: sent there, the request
    /// stores no second copy of them (and leaves a KDA state where its own prompt ends).
    pub mla_tokens: usize,
}

/// What to do with a batch that arrived.
#[derive(Debug, PartialEq, Eq)]
pub enum Arrival {
    Apply,
    /// Batches from this sequence number are missing: ask the replay socket, then apply this one.
    Gap(u64),
    /// The sequence started again: the engine restarted, its cache is empty.
    Restart,
}

impl RankIndex {
    pub fn arrival(&self, seq: u64) -> Arrival {
        match self.next {
            None => Arrival::Apply,
            Some(n) if seq == n => Arrival::Apply,
            Some(n) if seq > n => Arrival::Gap(n),
            Some(_) => Arrival::Restart,
        }
    }

    pub fn clear(&mut self) {
        self.mla.clear();
        self.kda.clear();
        self.next = None;
    }

    /// The K3 hit of a prompt whose full blocks hash to `hashes` (of `prompt_len` tokens), in
    /// tokens: the longest run of cached MLA blocks from the start, within the first `N - 1` tokens,
    /// cut back to the last block end where a KDA state is cached (vLLM's hybrid rule,
    /// v1/core/kv_cache_coordinator.py); MLA blocks alone are not a hit.
    pub fn hit(&self, hashes: &[u64], prompt_len: usize, block: usize) -> Hit {
        let limit = prompt_len.saturating_sub(1) / block.max(1);
        let run = hashes.iter().take(limit).take_while(|h| self.mla.contains(h)).count();
        let tokens = (0..run)
            .rev()
            .find(|i| hashes.get(*i).is_some_and(|h| self.kda.contains(h)))
            .map_or(0, |i| (i + 1) * block);
        Hit { tokens, mla_tokens: run * block }
    }

    /// Apply one decoded EventBatch (`[ts, events, rank]`) numbered `seq`.
    pub fn apply(&mut self, seq: u64, batch: &Mp) -> Result<(), String> {
        let events = batch.as_array().and_then(|b| b.get(1)).and_then(Mp::as_array).ok_or("not an EventBatch")?;
        for e in events {
            let hashes = || e.get("block_hashes").and_then(Mp::as_array).into_iter().flatten().filter_map(Mp::as_u64);
            let kda = e.get("kv_cache_spec_kind").and_then(Mp::as_str) == Some("mamba")
                || e.get("group_idx").and_then(Mp::as_u64) == Some(1);
            match e.get("type").and_then(Mp::as_str) {
                Some("BlockStored") => {
                    if let Some(b) = e.get("block_size").and_then(Mp::as_u64).and_then(|b| usize::try_from(b).ok()) {
                        self.block_size = Some(b);
                    }
                    let set = if kda { &mut self.kda } else { &mut self.mla };
                    set.extend(hashes());
                }
                Some("BlockRemoved") => {
                    // A removal names its group by index only (vLLM: "remove events only need group_idx+hash").
                    let set =
                        if e.get("group_idx").and_then(Mp::as_u64) == Some(1) { &mut self.kda } else { &mut self.mla };
                    for h in hashes() {
                        set.remove(&h);
                    }
                }
                Some("AllBlocksCleared") => {
                    self.mla.clear();
                    self.kda.clear();
                }
                _ => {}
            }
        }
        self.next = Some(seq + 1);
        Ok(())
    }
}

/// Every followed rank's index, by (engine authority, rank).
#[derive(Default)]
pub struct KvIndex {
    ranks: Mutex<HashMap<(String, u32), RankIndex>>,
}

impl KvIndex {
    /// Run `f` on a rank's index (created empty).
    pub fn with<R>(&self, authority: &str, rank: u32, f: impl FnOnce(&mut RankIndex) -> R) -> Option<R> {
        let mut all = self.ranks.lock().ok()?;
        Some(f(all.entry((authority.to_string(), rank)).or_default()))
    }

    /// Each (engine, rank)'s K3 hit for a prompt of these ids, in tokens; None for one whose cache
    /// is not known (never followed, or no block stored yet: its block size is unknown).
    pub fn hits(&self, keys: &[(&str, u32)], ids: &[u64]) -> Vec<Option<Hit>> {
        let Ok(all) = self.ranks.lock() else {
            return vec![None; keys.len()];
        };
        let mut chains: Vec<(usize, Vec<u64>)> = Vec::new();
        keys.iter()
            .map(|(authority, rank)| {
                let r = all.get(&((*authority).to_string(), *rank))?;
                let b = r.block_size?;
                let at = match chains.iter().position(|(size, _)| *size == b) {
                    Some(at) => at,
                    None => {
                        chains.push((b, block_hashes(ids, b)));
                        chains.len() - 1
                    }
                };
                chains.get(at).map(|(_, h)| r.hit(h, ids.len(), b))
            })
            .collect()
    }

    /// Blocks each (engine, rank) of `keys` holds by its events (0 when unknown): how full its cache
    /// is, which breaks ties between equal hits (the emptiest evicts least).
    pub fn held(&self, keys: &[(&str, u32)]) -> Vec<usize> {
        let Ok(all) = self.ranks.lock() else {
            return vec![0; keys.len()];
        };
        keys.iter()
            .map(|(authority, rank)| {
                all.get(&((*authority).to_string(), *rank)).map_or(0, |r| r.mla.len() + r.kda.len())
            })
            .collect()
    }

    pub fn forget(&self, authority: &str) {
        if let Ok(mut all) = self.ranks.lock() {
            all.retain(|(a, _), _| a != authority);
        }
    }

    fn publish(&self, role: &str, authority: &str) {
        let (mut mla, mut kda) = (0usize, 0usize);
        if let Ok(all) = self.ranks.lock() {
            for (_, r) in all.iter().filter(|((a, _), _)| a == authority) {
                mla += r.mla.len();
                kda += r.kda.len();
            }
        }
        for (group, n) in [("mla_attention", mla), ("mamba", kda)] {
            METRICS.set(
                "kimik3_router_kv_index_blocks",
                &[("role", role), ("engine", authority), ("group", group)],
                n as f64,
            );
        }
    }
}

fn outcome(o: &'static str) {
    METRICS.inc("kimik3_router_kv_events_total", &[("outcome", o)]);
}

/// host:port of a publisher endpoint (`tcp://*:5557`) on the engine's host.
pub fn publisher_addr(endpoint: &str, engine_authority: &str) -> Option<String> {
    let rest = endpoint.strip_prefix("tcp://")?;
    let (host, port) = rest.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    let engine_host = engine_authority.rsplit_once(':').map_or(engine_authority, |(h, _)| h);
    let host = if host == "*" || host == "0.0.0.0" { engine_host } else { host };
    Some(format!("{host}:{port}"))
}

/// Read the engine's publishers and follow each rank until the engine is removed.
pub async fn follow(cfg: Arc<Config>, index: Arc<KvIndex>, endpoint: Arc<Endpoint>) {
    let sources = match crate::upstream::get(&endpoint.authority, "/kv_event_sources", cfg.health_timeout).await {
        Ok((200, body)) => serde_json::from_slice::<serde_json::Value>(&body).unwrap_or_default(),
        Ok((status, _)) => {
            crate::info!("engine {} has no KV event sources ({status}): its cache is not followed", endpoint.authority);
            return;
        }
        Err(e) => {
            crate::info!("engine {}: reading its KV event sources failed: {e}", endpoint.authority);
            return;
        }
    };
    let Some(ranks) = sources.as_object().filter(|m| !m.is_empty()) else {
        crate::info!("engine {} publishes no KV events: its cache is not followed", endpoint.authority);
        return;
    };
    for (rank, source) in ranks {
        let (Ok(rank), Some(pub_addr)) = (
            rank.parse::<u32>(),
            source.get("endpoint").and_then(|e| e.as_str()).and_then(|e| publisher_addr(e, &endpoint.authority)),
        ) else {
            continue;
        };
        let replay =
            source.get("replay_endpoint").and_then(|e| e.as_str()).and_then(|e| publisher_addr(e, &endpoint.authority));
        let topic = source.get("topic").and_then(|t| t.as_str()).unwrap_or_default().as_bytes().to_vec();
        tokio::spawn(follow_rank(index.clone(), endpoint.clone(), rank, pub_addr, replay, topic));
    }
}

async fn follow_rank(
    index: Arc<KvIndex>,
    endpoint: Arc<Endpoint>,
    rank: u32,
    addr: String,
    replay: Option<String>,
    topic: Vec<u8>,
) {
    let role = endpoint.role.name();
    let mut wait = Duration::from_millis(100);
    while !endpoint.removed.load(Ordering::Relaxed) {
        match subscribe(&addr, &topic).await {
            Ok(mut sub) => {
                wait = Duration::from_millis(100);
                crate::info!("following the KV events of {} rank {rank} at {addr}", endpoint.authority);
                let why = read(&mut sub, &index, &endpoint, rank, replay.as_deref()).await;
                crate::info!("KV events of {} rank {rank}: {why}", endpoint.authority);
            }
            Err(e) => crate::debug!("KV events of {} rank {rank}: {e}", endpoint.authority),
        }
        // Whatever happened meanwhile is unknown: forget it rather than claim it.
        index.with(&endpoint.authority, rank, RankIndex::clear);
        index.publish(role, &endpoint.authority);
        outcome("disconnected");
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(Duration::from_secs(5));
    }
    index.forget(&endpoint.authority);
}

async fn subscribe(addr: &str, topic: &[u8]) -> Result<Socket, String> {
    let mut sub = tokio::time::timeout(Duration::from_secs(5), Socket::connect(addr, "SUB"))
        .await
        .map_err(|_| format!("connect to {addr} timed out"))??;
    sub.subscribe(topic).await?;
    Ok(sub)
}

async fn read(sub: &mut Socket, index: &KvIndex, endpoint: &Endpoint, rank: u32, replay: Option<&str>) -> String {
    let role = endpoint.role.name();
    let mut first = true;
    loop {
        if endpoint.removed.load(Ordering::Relaxed) {
            return "engine removed".into();
        }
        // No timeout around recv: a read cut mid-frame would lose the stream's framing. A removed
        // engine's follower ends at its next message or when its connection closes.
        let parts = match sub.recv().await {
            Err(e) => return e,
            Ok(p) => p,
        };
        let (Some(seq), Some(payload)) = (parts.get(1).and_then(|s| seq_of(s)), parts.get(2)) else {
            outcome("undecodable");
            continue;
        };
        let mut arrival = index.with(&endpoint.authority, rank, |r| r.arrival(seq)).unwrap_or(Arrival::Apply);
        if std::mem::take(&mut first) && seq > 0 {
            // Subscribed late: what the engine published before is in its replay buffer (the
            // oldest batches may have left it: blocks stored then stay unknown, never wrong).
            if let Some(addr) = replay {
                match fill(addr, index, &endpoint.authority, rank, 0, seq, true).await {
                    Ok(()) => outcome("replayed"),
                    Err(e) => {
                        crate::info!("KV events of {} rank {rank}: catching up failed ({e})", endpoint.authority);
                        index.with(&endpoint.authority, rank, RankIndex::clear);
                    }
                }
                arrival = Arrival::Apply;
            }
        }
        match arrival {
            Arrival::Apply => {}
            Arrival::Restart => {
                index.with(&endpoint.authority, rank, RankIndex::clear);
                outcome("restart_cleared");
            }
            Arrival::Gap(from) => {
                let filled = match replay {
                    Some(addr) => fill(addr, index, &endpoint.authority, rank, from, seq, false).await,
                    None => Err("no replay socket".into()),
                };
                match filled {
                    Ok(()) => outcome("replayed"),
                    Err(e) => {
                        crate::info!(
                            "KV events of {} rank {rank}: a gap from {from} not filled ({e})",
                            endpoint.authority
                        );
                        index.with(&endpoint.authority, rank, RankIndex::clear);
                        outcome("gap_cleared");
                    }
                }
            }
        }
        match decode(payload) {
            Ok(batch) => {
                let _ = index.with(&endpoint.authority, rank, |r| r.apply(seq, &batch));
                outcome("applied");
            }
            Err(_) => {
                index.with(&endpoint.authority, rank, RankIndex::clear);
                outcome("undecodable");
            }
        }
        index.publish(role, &endpoint.authority);
    }
}

fn seq_of(bytes: &[u8]) -> Option<u64> {
    let raw: [u8; 8] = bytes.try_into().ok()?;
    let v = i64::from_be_bytes(raw);
    u64::try_from(v).ok()
}

/// Batches [from, until) from the rank's replay socket, applied in order. `catch_up`: the buffer may
/// start later than `from` (nothing was known before: a late start loses nothing known).
async fn fill(
    addr: &str,
    index: &KvIndex,
    authority: &str,
    rank: u32,
    from: u64,
    until: u64,
    catch_up: bool,
) -> Result<(), String> {
    let work = async {
        let mut dealer = Socket::connect(addr, "DEALER").await?;
        dealer.send(&[b"", &from.to_be_bytes()]).await?;
        let mut expected = from;
        loop {
            let parts = dealer.recv().await?;
            let seq = parts.get(2).and_then(|s| seq_of(s));
            let Some(seq) = seq else {
                break; // the end marker (-1)
            };
            if seq < expected {
                continue;
            }
            if catch_up && seq > expected && expected == from {
                expected = seq;
            }
            if seq != expected {
                return Err(format!("the replay starts at {seq}, not {expected}"));
            }
            if seq >= until {
                break;
            }
            let batch = decode(parts.get(3).map(Vec::as_slice).unwrap_or_default())?;
            index.with(authority, rank, |r| r.apply(seq, &batch)).transpose()?;
            expected += 1;
        }
        if expected < until { Err(format!("the replay ended at {expected}, before {until}")) } else { Ok(()) }
    };
    tokio::time::timeout(Duration::from_secs(5), work).await.map_err(|_| "the replay timed out".to_string())?
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(kind: &str, group: u64, hashes: &[u64]) -> Mp {
        Mp::Map(vec![
            (Mp::Str("type".into()), Mp::Str("BlockStored".into())),
            (Mp::Str("block_hashes".into()), Mp::Array(hashes.iter().map(|h| Mp::Int(i128::from(*h))).collect())),
            (Mp::Str("group_idx".into()), Mp::Int(i128::from(group))),
            (Mp::Str("kv_cache_spec_kind".into()), Mp::Str(kind.into())),
        ])
    }

    fn batch(events: Vec<Mp>) -> Mp {
        Mp::Array(vec![Mp::Float(0.0), Mp::Array(events), Mp::Int(0)])
    }

    #[test]
    fn stores_and_removals_per_group_and_sequence_rules() {
        let mut r = RankIndex::default();
        assert_eq!(r.arrival(5), Arrival::Apply, "the first batch seen starts the count");
        r.apply(5, &batch(vec![stored("mla_attention", 0, &[1, 2, 3]), stored("mamba", 1, &[3])])).ok();
        assert_eq!((r.mla.len(), r.kda.len()), (3, 1));
        let removed = Mp::Map(vec![
            (Mp::Str("type".into()), Mp::Str("BlockRemoved".into())),
            (Mp::Str("block_hashes".into()), Mp::Array(vec![Mp::Int(3)])),
            (Mp::Str("group_idx".into()), Mp::Int(1)),
        ]);
        assert_eq!(r.arrival(6), Arrival::Apply);
        r.apply(6, &batch(vec![removed])).ok();
        assert_eq!((r.mla.len(), r.kda.len()), (3, 0), "a removal names its group");
        assert_eq!(r.arrival(9), Arrival::Gap(7));
        assert_eq!(r.arrival(0), Arrival::Restart);
        r.apply(7, &batch(vec![Mp::Map(vec![(Mp::Str("type".into()), Mp::Str("AllBlocksCleared".into()))])])).ok();
        assert!(r.mla.is_empty());
        assert!(r.apply(8, &Mp::Nil).is_err());
    }

    #[test]
    fn block_hashes_are_the_simulators_vllm_checked_chain() {
        // kimik3_simulator.prefix_cache.block_hashes (held to vLLM's own hasher by
        // tests/contract/test_simulator_hashes.py) over these ids, block 4, as event hashes.
        let ids = [1, 23, 24, 255, 256, 65535, 65536, (1 << 31) - 1, 0, 7, 300, 70000];
        assert_eq!(block_hashes(&ids, 4), vec![3129330480506261839, 16916645735790678037, 8979674607848245522]);
        assert_eq!(block_hashes(&ids[..7], 4).len(), 1, "only full blocks");
    }

    #[test]
    fn a_k3_hit_needs_a_kda_state_at_its_end() {
        let h = block_hashes(&(0..40).collect::<Vec<u64>>(), 8); // 5 blocks
        let mut r = RankIndex::default();
        r.mla.extend(h.iter().take(4));
        let hit = |r: &RankIndex, n| r.hit(&h, n, 8).tokens;
        assert_eq!(r.hit(&h, 40, 8), Hit { tokens: 0, mla_tokens: 32 }, "MLA blocks alone are no hit");
        r.kda.insert(h[1]);
        assert_eq!(hit(&r, 40), 16);
        r.kda.insert(h[3]);
        assert_eq!(hit(&r, 40), 32);
        assert_eq!(hit(&r, 32), 16, "at most N - 1 tokens: the state at 32 is out of reach");
        r.mla.remove(&h[2]);
        assert_eq!(
            r.hit(&h, 40, 8),
            Hit { tokens: 16, mla_tokens: 16 },
            "the MLA run stops at the first missing block"
        );
    }

    #[test]
    fn publisher_endpoints_are_on_the_engines_host() {
        assert_eq!(publisher_addr("tcp://*:5558", "10.0.0.7:8000").as_deref(), Some("10.0.0.7:5558"));
        assert_eq!(publisher_addr("tcp://10.1.1.1:5557", "10.0.0.7:8000").as_deref(), Some("10.1.1.1:5557"));
        assert_eq!(publisher_addr("ipc:///tmp/x", "10.0.0.7:8000"), None);
    }
}
