//! The router in P/D mode in front of the project's engine simulator (simulator/), started from the
//! golden scenario's rendered prefill and decode commands (TP8 x DP2, NIXL producer/consumer).
//! Never skipped: if Python or the simulator cannot start, the test fails and says why.
//! Python: $KIMIK3_PYTHON (tests/router/test_crate.py sets the project venv's), else python3 on PATH.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

mod common;

use common::*;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const DEFAULT_PYTHON: &str = "python3";
const SCENARIO: &str = "b200-dep16-disaggregated";

struct Sim {
    port: u16,
    child: Child,
    log: PathBuf,
}

impl Drop for Sim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn repo() -> PathBuf {
    manifest_dir().parent().unwrap().to_path_buf()
}

fn python() -> String {
    let py = std::env::var("KIMIK3_PYTHON").unwrap_or_else(|_| DEFAULT_PYTHON.to_string());
    assert!(
        Path::new(&py).exists(),
        "the simulator test needs Python with the simulator's dependencies (aiohttp, prometheus_client): \
         {py} does not exist; set KIMIK3_PYTHON"
    );
    py
}

fn pythonpath() -> String {
    let r = repo();
    format!("{}:{}:{}", r.display(), r.join("operator").display(), r.join("simulator").display())
}

/// The rendered leader commands of the scenario's prefill and decode roles.
fn commands() -> (Vec<String>, Vec<String>) {
    let script = format!(
        "import json\nfrom tests.simulator.sims import role_report, expand\n\
         print(json.dumps([expand(role_report({SCENARIO:?}, r)['command']) for r in ('prefill', 'decode')]))"
    );
    let out = Command::new(python())
        .args(["-c", &script])
        .env("PYTHONPATH", pythonpath())
        .current_dir(repo())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "rendering the scenario's commands failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Vec<Vec<String>> = serde_json::from_slice(&out.stdout).unwrap();
    (v[0].clone(), v[1].clone())
}

fn start_sim(cmd: &[String], dir: &Path, name: &str) -> Sim {
    let port = free_port();
    let log = dir.join(format!("{name}.log"));
    let child = Command::new(python())
        .args(["-m", "kimik3_simulator"])
        .args(cmd)
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .env("PYTHONPATH", pythonpath())
        .env("K3SIM_GPU_PRODUCT", "B200")
        // The prefill's NIXL side channel (the decode reads the KV over it): on loopback, from a
        // base of its own, as tests/simulator/sims.py starts them.
        .env("VLLM_NIXL_SIDE_CHANNEL_HOST", "127.0.0.1")
        .env("VLLM_HOST_IP", "127.0.0.1")
        .env("VLLM_NIXL_SIDE_CHANNEL_PORT", side_channel_base().to_string())
        .env("K3SIM_OUTPUT_TOKENS", "64")
        .env("K3SIM_THINKING_TOKENS", "200")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    Sim { port, child, log }
}

/// Bases handed out in this process: the tests run side by side, and a range that is free when one
/// test checks it may be another test's simulator's a moment later.
static TAKEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());

/// A loopback port with 16 free ports from it (one per data-parallel rank), below Linux's ephemeral
/// range, where outgoing connections do not take ports between this check and the simulator's bind,
/// and clear of every range this process gave another simulator.
fn side_channel_base() -> u16 {
    let mut taken = TAKEN.lock().unwrap();
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
    let seed = nanos ^ std::process::id().wrapping_mul(2_654_435_761);
    for i in 0..200u32 {
        let offset = seed.wrapping_mul(2_654_435_761).wrapping_add(i.wrapping_mul(7_919)) % (32_768 - 16 - 20_000);
        let base = 20_000 + offset as u16;
        if taken.iter().any(|t| base < t + 16 && *t < base + 16) {
            continue;
        }
        if (base..base + 16).all(|p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok()) {
            taken.push(base);
            return base;
        }
    }
    panic!("no 16 consecutive free loopback ports below 32768");
}

async fn wait_healthy(sim: &mut Sim) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(code) = sim.child.try_wait().unwrap() {
            panic!("the simulator exited with {code}:\n{}", std::fs::read_to_string(&sim.log).unwrap_or_default());
        }
        if let Ok((200, _, _)) = try_call(sim.port, "GET", "/health", &[], b"").await {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the simulator was not healthy in 60 s:\n{}",
            std::fs::read_to_string(&sim.log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn pd_handoff_through_the_simulator() {
    let dir = std::env::temp_dir().join(format!("kimik3-router-sim-{}", free_port()));
    std::fs::create_dir_all(&dir).unwrap();
    let (prefill_cmd, decode_cmd) = commands();
    let mut prefill = start_sim(&prefill_cmd, &dir, "prefill");
    let mut decode = start_sim(&decode_cmd, &dir, "decode");
    wait_healthy(&mut prefill).await;
    wait_healthy(&mut decode).await;
    let r = Router::start(&s(&[
        "--mode",
        "pd",
        "--prefill",
        &format!("http://127.0.0.1:{}", prefill.port),
        "--decode",
        &format!("http://127.0.0.1:{}", decode.port),
    ]))
    .await;
    // DP2 engines: one worker per rank, read from their /metrics.
    assert_eq!(r.metric("kimik3_router_engines", &[("role", "decode")]).await, 2.0);

    let prompt: String = (0..3000).map(|i| format!("w{i} ")).collect();
    let (status, headers, text) = call(
        r.port,
        "POST",
        "/v1/completions",
        &[("x-request-id", "sim-client-1")],
        &serde_json::to_vec(&json!({"model": "kimi-k3", "prompt": prompt, "max_tokens": 8})).unwrap(),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(headers["x-request-id"], "sim-client-1");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["usage"]["completion_tokens"], 8);
    assert_eq!(v["usage"]["prompt_tokens"], 3000);

    let body = json!({"model": "kimi-k3", "messages": [{"role": "user", "content": prompt}], "max_tokens": 8,
                      "stream": true, "stream_options": {"include_usage": true}});
    let (status, _, text) = post(r.port, "/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{text}");
    let ev = events(&text);
    assert_eq!(ev.last(), Some(&json!("[DONE]")), "{text}");
    assert!(!text.contains("\"error\""), "{text}");
    assert!(ev.iter().any(|e| e.get("usage").is_some_and(|u| u.is_object())), "{text}");

    // The Responses API through the same hand-off (vLLM 0.33.0 takes kv_transfer_params there too):
    // whole and streamed, the usage's prompt side from the prefill; what needs a store is refused.
    let ask = json!({"model": "kimi-k3", "instructions": "Be brief.", "input": prompt, "max_output_tokens": 5,
                     "store": true});
    let (status, _, text) = post(r.port, "/v1/responses", &ask).await;
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!((v["object"].as_str(), v["status"].as_str()), (Some("response"), Some("incomplete")), "{text}");
    assert_eq!(v["usage"]["output_tokens"], 5, "{text}");
    assert_eq!(v["usage"]["total_tokens"], v["usage"]["input_tokens"].as_u64().unwrap() + 5, "{text}");
    let (status, _, text) =
        post(r.port, "/v1/responses", &json!({"stream": true, "max_output_tokens": 4, "input": "hi there"})).await;
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("event: response.incomplete\n") && !text.contains("event: error"), "{text}");
    let ev = events(&text);
    assert_eq!(ev.first().and_then(|e| e["type"].as_str()), Some("response.created"), "{text}");
    assert_eq!(ev.last().and_then(|e| e["type"].as_str()), Some("response.incomplete"), "{text}");
    let (status, _, text) =
        post(r.port, "/v1/responses", &json!({"input": "hi", "previous_response_id": "resp_1"})).await;
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("previous_response_id"), "{text}");
    let (status, _, text) = call(r.port, "GET", "/v1/responses/resp_1", &[], b"").await;
    assert_eq!(status, 404, "{text}");

    // The decode pulled the prompt from the prefill (no local prefill), once per request.
    let (_, _, stats) = call(decode.port, "GET", "/sim/stats", &[], b"").await;
    let stats: Value = serde_json::from_str(&stats).unwrap();
    let records: Vec<&Value> = stats["by_request_id"].as_object().unwrap().values().collect();
    assert_eq!(records.len(), 4, "{stats}");
    for rec in records {
        assert_eq!(rec["path"], "remote_prefill", "{rec}");
    }
    let (_, _, stats) = call(prefill.port, "GET", "/sim/stats", &[], b"").await;
    let stats: Value = serde_json::from_str(&stats).unwrap();
    for rec in stats["by_request_id"].as_object().unwrap().values() {
        assert_eq!(rec["path"], "prefill_for_remote_decode", "{rec}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// One of two engines of a role SIGKILLed under an open-loop load (bounded: 60 requests in ~6 s):
/// no request fails: a non-streamed one is sent elsewhere, a stream that had begun moves to the
/// other engine (migrate.rs).
async fn kill_one_under_load(kill_prefill: bool) {
    let dir = std::env::temp_dir().join(format!("kimik3-router-chaos-{}", free_port()));
    std::fs::create_dir_all(&dir).unwrap();
    let (prefill_cmd, decode_cmd) = commands();
    let victim_cmd = if kill_prefill { &prefill_cmd } else { &decode_cmd };
    let mut other = start_sim(if kill_prefill { &decode_cmd } else { &prefill_cmd }, &dir, "other");
    let mut victim = start_sim(victim_cmd, &dir, "victim");
    let mut survivor = start_sim(victim_cmd, &dir, "survivor");
    for sim in [&mut other, &mut victim, &mut survivor] {
        wait_healthy(sim).await;
    }
    let (role, other_role) = if kill_prefill { ("--prefill", "--decode") } else { ("--decode", "--prefill") };
    let r = Router::start(&s(&[
        "--mode",
        "pd",
        "--prefill-policy",
        "round_robin",
        "--decode-policy",
        "round_robin",
        "--health-interval-ms",
        "200",
        other_role,
        &format!("http://127.0.0.1:{}", other.port),
        role,
        &format!("http://127.0.0.1:{}", victim.port),
        role,
        &format!("http://127.0.0.1:{}", survivor.port),
    ]))
    .await;
    let port = r.port;
    let mut tasks = Vec::new();
    let started = Instant::now();
    for i in 0..60u32 {
        let at = started + Duration::from_millis(100 * u64::from(i));
        tokio::time::sleep_until(at.into()).await;
        if i == 20 {
            victim.child.kill().unwrap();
        }
        let stream = i % 2 == 0;
        let prompt: String = (0..500).map(|w| format!("c{i}w{w} ")).collect();
        tasks.push(tokio::spawn(async move {
            let body = json!({"model": "kimi-k3", "prompt": prompt, "max_tokens": 64, "stream": stream});
            (stream, post(port, "/v1/completions", &body).await)
        }));
    }
    let (mut ok, mut cut) = (0, 0);
    for t in tasks {
        let (stream, (status, _, text)) = t.await.unwrap();
        if !stream {
            assert_eq!(status, 200, "a non-streamed request failed: {text}");
            ok += 1;
            continue;
        }
        assert_eq!(status, 200, "a stream failed before any byte: {text}");
        let ev = events(&text);
        assert_eq!(ev.last(), Some(&json!("[DONE]")), "a stream ended without [DONE]: {text}");
        if ev.iter().any(|e| e.get("error").is_some()) {
            assert!(ev.len() >= 3, "a cut stream must have relayed a token before its error event: {text}");
            cut += 1;
        } else {
            ok += 1;
        }
    }
    let what = if kill_prefill { "prefill" } else { "decode" };
    eprintln!("{what} killed under load: {ok} whole answers, {cut} streams cut (each ended with an error event)");
    let moved = r.metric("kimik3_router_migrations_total", &[("outcome", "moved")]).await;
    eprintln!("streams moved: {moved}");
    assert_eq!(cut, 0, "a stream in flight on the killed engine moves instead of being cut");
    assert_eq!(ok + cut, 60);
    let victim_engine = format!("127.0.0.1:{}", victim.port);
    let before = r.metric("kimik3_router_leg_requests_total", &[("engine", &victim_engine), ("outcome", "ok")]).await;
    let after_kill = r.metric("kimik3_router_leg_requests_total", &[("engine", &victim_engine)]).await - before;
    eprintln!("legs on the killed {what}: {before} ok, {after_kill} failed");
    assert!(before >= 1.0, "the killed {what} served nothing before it died: the test proves nothing");
    if kill_prefill {
        assert_eq!(cut, 0, "a prefill's death cuts no stream: nothing was relayed before its leg ended");
    }
    assert_eq!(r.metric("kimik3_router_engine_healthy", &[("engine", &victim_engine)]).await, 0.0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_decode_killed_under_load_costs_only_streams_it_was_serving() {
    kill_one_under_load(false).await;
}

#[tokio::test]
async fn a_prefill_killed_under_load_costs_nothing() {
    kill_one_under_load(true).await;
}

/// The decode serving a long stream is SIGKILLed mid-way (P/D, two decodes): the stream moves to the
/// other decode from its prompt and generated ids and the client reads one answer, the same as an
/// uninterrupted run's (the simulator's model is a function of the context), under one response id,
/// with usage over the whole answer; for completions, and for chat with K3's think channel (the
/// continuation runs on /v1/completions and the router splits reasoning from content itself).
/// `drain`: the decode is SIGTERMed with a shutdown timeout of 0 instead: vLLM then aborts what is
/// in flight, and the stream ends with the engine's own error event, which moves it too.
async fn a_stream_moves_when_its_decode_dies(path: &str, body: Value, drain: bool) {
    let dir = std::env::temp_dir().join(format!("kimik3-router-move-{}", free_port()));
    std::fs::create_dir_all(&dir).unwrap();
    let (prefill_cmd, mut decode_cmd) = commands();
    if drain {
        decode_cmd.extend(["--shutdown-timeout".to_string(), "0".to_string()]);
    }
    let mut prefill = start_sim(&prefill_cmd, &dir, "prefill");
    let mut decodes = [start_sim(&decode_cmd, &dir, "d0"), start_sim(&decode_cmd, &dir, "d1")];
    wait_healthy(&mut prefill).await;
    for d in decodes.iter_mut() {
        wait_healthy(d).await;
    }
    let r = Router::start(&s(&[
        "--mode",
        "pd",
        "--decode-policy",
        "round_robin",
        "--health-interval-ms",
        "200",
        "--prefill",
        &format!("http://127.0.0.1:{}", prefill.port),
        "--decode",
        &format!("http://127.0.0.1:{}", decodes[0].port),
        "--decode",
        &format!("http://127.0.0.1:{}", decodes[1].port),
    ]))
    .await;
    let port = r.port;
    let path = path.to_string();
    let (p, b) = (path.clone(), body.clone());
    let moved = tokio::spawn(async move { post(port, &p, &b).await });
    // The decode that took it, once it has streamed for a while.
    let deadline = Instant::now() + Duration::from_secs(30);
    let victim = loop {
        assert!(Instant::now() < deadline, "no decode took the stream in 30 s");
        let mut busy = None;
        for (i, d) in decodes.iter().enumerate() {
            let (_, _, stats) = call(d.port, "GET", "/sim/stats", &[], b"").await;
            let stats: Value = serde_json::from_str(&stats).unwrap();
            if stats["engine"]["in_flight"].as_u64() == Some(1) {
                busy = Some(i);
            }
        }
        if let Some(i) = busy {
            break i;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    tokio::time::sleep(Duration::from_millis(600)).await;
    if drain {
        let pid = decodes[victim].child.id().to_string();
        assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    } else {
        decodes[victim].child.kill().unwrap();
    }
    let (status, _, text) = moved.await.unwrap();
    assert_eq!(status, 200, "{text}");
    assert!(!text.contains("\"error\""), "the stream was cut: {text}");
    assert_eq!(r.metric("kimik3_router_migrations_total", &[("outcome", "moved")]).await, 1.0, "{}", r.log_text());
    // The same request again, uninterrupted (the dead decode is ejected: it runs on the other one).
    let (status, _, whole) = post(port, &path, &body).await;
    assert_eq!(status, 200, "{whole}");
    let (got, want) = (answer(&text), answer(&whole));
    assert!(got.tokens > 20, "the stream was too short to be cut mid-way: {text}");
    assert_eq!((got.content.as_str(), got.reasoning.as_str()), (want.content.as_str(), want.reasoning.as_str()));
    assert_eq!(got.ids, want.ids);
    assert_eq!(got.ids.len() as u64, got.tokens);
    assert_eq!(got.usage, want.usage, "usage over the whole answer");
    assert_eq!(got.response_ids.len(), 1, "one response id: {:?}", got.response_ids);
    assert_eq!(got.finish, want.finish);
    let log = r.log_text();
    let line = log.lines().find(|l| l.contains("moving a stream")).unwrap_or_default();
    eprintln!("{path}: {line}; {} tokens, {} reasoning words", got.tokens, got.reasoning.split_whitespace().count());
    let _ = std::fs::remove_dir_all(&dir);
}

#[derive(Default, Debug)]
struct Answer {
    content: String,
    reasoning: String,
    ids: Vec<u64>,
    tokens: u64,
    usage: Value,
    response_ids: std::collections::BTreeSet<String>,
    finish: Vec<String>,
}

fn answer(text: &str) -> Answer {
    let mut a = Answer::default();
    for e in events(text) {
        if let Some(id) = e["id"].as_str() {
            a.response_ids.insert(id.to_string());
        }
        if e["usage"].is_object() {
            a.usage = e["usage"].clone();
            a.tokens = e["usage"]["completion_tokens"].as_u64().unwrap_or(0);
        }
        for c in e["choices"].as_array().into_iter().flatten() {
            let delta = if c["delta"].is_object() { &c["delta"] } else { c };
            a.content += delta["content"].as_str().or(c["text"].as_str()).unwrap_or_default();
            a.reasoning += delta["reasoning"].as_str().unwrap_or_default();
            a.ids.extend(c["token_ids"].as_array().into_iter().flatten().filter_map(Value::as_u64));
            if let Some(f) = c["finish_reason"].as_str() {
                a.finish.push(f.to_string());
            }
        }
    }
    a
}

/// A 900-token completion stream of a 400-word prompt of its own (`tag`: no prefix shared).
fn long_completion(tag: &str) -> Value {
    let prompt: String = (0..400).map(|i| format!("{tag}{i} ")).collect();
    json!({"model": "kimi-k3", "prompt": prompt, "max_tokens": 900, "ignore_eos": true, "stream": true,
           "return_token_ids": true, "stream_options": {"include_usage": true}})
}

#[tokio::test]
async fn a_completion_stream_moves_when_its_decode_dies() {
    a_stream_moves_when_its_decode_dies("/v1/completions", long_completion("m"), false).await;
}

#[tokio::test]
async fn a_completion_stream_moves_when_its_decode_drains_and_aborts_it() {
    a_stream_moves_when_its_decode_dies("/v1/completions", long_completion("d"), true).await;
}

#[tokio::test]
async fn a_thinking_chat_stream_moves_when_its_decode_dies() {
    let prompt: String = (0..400).map(|i| format!("t{i} ")).collect();
    // No cap: the continuation's is the room left in the context (from the engine's /v1/models), as
    // the chat request's own default; the answer stops by itself (200 thinking + 3 + 64 tokens).
    let body = json!({"model": "kimi-k3", "messages": [{"role": "user", "content": prompt}],
                      "stream": true, "return_token_ids": true,
                      "chat_template_kwargs": {"thinking": true}, "stream_options": {"include_usage": true}});
    a_stream_moves_when_its_decode_dies("/v1/chat/completions", body, false).await;
}

/// The router follows a prefill's KV events (vLLM's wire format, the simulator's publisher): it reads
/// `/kv_event_sources`, subscribes to each DP rank, catches up from the replay socket on what was
/// published before it subscribed, and counts the blocks each KV cache group holds: the MLA blocks of
/// every prompt, and a KDA state only where the engine keeps one (its last whole block, semantic
/// retention). A prompt served again stores nothing new.
#[tokio::test]
async fn the_router_follows_a_prefills_kv_events_and_catches_up_from_the_replay() {
    let dir = std::env::temp_dir().join(format!("kimik3-router-kv-{}", free_port()));
    std::fs::create_dir_all(&dir).unwrap();
    let (mut prefill_cmd, decode_cmd) = commands();
    let base = side_channel_base();
    let config = json!({"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": format!("tcp://*:{base}"),
                        "replay_endpoint": format!("tcp://*:{}", base + 8)});
    prefill_cmd.extend(["--kv-events-config".to_string(), config.to_string()]);
    let mut prefill = start_sim(&prefill_cmd, &dir, "prefill");
    let mut decode = start_sim(&decode_cmd, &dir, "decode");
    wait_healthy(&mut prefill).await;
    wait_healthy(&mut decode).await;
    let (_, _, stats) = call(prefill.port, "GET", "/sim/stats", &[], b"").await;
    let block = serde_json::from_str::<Value>(&stats).unwrap()["engine"]["block_size"].as_u64().unwrap() as usize;
    let words = |tag: &str, n: usize| (0..n).map(|i| format!("{tag}{i}")).collect::<Vec<_>>().join(" ");
    // Before the router exists: only the replay can tell it.
    let early = json!({"model": "kimi-k3", "prompt": words("early", 3 * block + 5), "max_tokens": 2});
    let (status, _, text) = call(
        prefill.port,
        "POST",
        "/v1/completions",
        &[("X-data-parallel-rank", "0")],
        &serde_json::to_vec(&early).unwrap(),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    let r = Router::start(&s(&[
        "--mode",
        "pd",
        "--kv-events",
        "true",
        "--prefill",
        &format!("http://127.0.0.1:{}", prefill.port),
        "--decode",
        &format!("http://127.0.0.1:{}", decode.port),
    ]))
    .await;
    let late = json!({"model": "kimi-k3", "prompt": words("late", 2 * block + 1), "max_tokens": 2});
    for _ in 0..2 {
        let (status, _, text) = post(r.port, "/v1/completions", &late).await;
        assert_eq!(status, 200, "{text}");
    }
    let engine = format!("127.0.0.1:{}", prefill.port);
    let want = (3.0 + 2.0, 2.0); // MLA blocks of both prompts; one KDA state each
    let deadline = Instant::now() + Duration::from_secs(20);
    let got = loop {
        let mla = r.metric("kimik3_router_kv_index_blocks", &[("engine", &engine), ("group", "mla_attention")]).await;
        let kda = r.metric("kimik3_router_kv_index_blocks", &[("engine", &engine), ("group", "mamba")]).await;
        if (mla, kda) == want || Instant::now() > deadline {
            break (mla, kda);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(got, want, "{}", r.log_text());
    assert!(r.metric("kimik3_router_kv_events_total", &[("outcome", "replayed")]).await >= 1.0, "{}", r.log_text());
    assert_eq!(r.metric("kimik3_router_kv_events_total", &[("outcome", "gap_cleared")]).await, 0.0);
    let _ = std::fs::remove_dir_all(&dir);
}

/// precise_prefix on two prefills (DP2 each: four (engine, rank) caches): the router tokenizes a
/// text prompt with an engine's /tokenize, hashes it as vLLM does, and sends a prompt that extends an
/// earlier one to the rank holding that one's KDA state; the hit it counted equals the hit the
/// engine found (never above it).
#[tokio::test]
async fn precise_prefix_routes_to_the_rank_holding_the_true_k3_hit() {
    let dir = std::env::temp_dir().join(format!("kimik3-router-precise-{}", free_port()));
    std::fs::create_dir_all(&dir).unwrap();
    let (prefill_cmd, decode_cmd) = commands();
    let mut prefills = Vec::new();
    for name in ["p0", "p1"] {
        // As the operator renders it: each rank on the node's IP and a port the OS picks, which
        // /kv_event_sources names (the other test covers a wildcard with a port plan).
        let config = json!({"enable_kv_cache_events": true, "endpoint": "tcp://*:0", "replay_endpoint": "tcp://*:0"});
        let mut cmd = prefill_cmd.clone();
        cmd.extend(["--kv-events-config".to_string(), config.to_string()]);
        prefills.push(start_sim(&cmd, &dir, name));
    }
    let mut decode = start_sim(&decode_cmd, &dir, "decode");
    for p in prefills.iter_mut() {
        wait_healthy(p).await;
    }
    wait_healthy(&mut decode).await;
    let (_, _, stats) = call(prefills[0].port, "GET", "/sim/stats", &[], b"").await;
    let block = serde_json::from_str::<Value>(&stats).unwrap()["engine"]["block_size"].as_u64().unwrap() as usize;
    let r = Router::start(&s(&[
        "--mode",
        "pd",
        "--prefill-policy",
        "precise_prefix",
        "--prefill",
        &format!("http://127.0.0.1:{}", prefills[0].port),
        "--prefill",
        &format!("http://127.0.0.1:{}", prefills[1].port),
        "--decode",
        &format!("http://127.0.0.1:{}", decode.port),
    ]))
    .await;
    let words = |n: usize| (0..n).map(|i| format!("q{i}")).collect::<Vec<_>>().join(" ");
    let first = 3 * block + 1; // its KDA state: at 3 blocks
    let (status, _, text) =
        post(r.port, "/v1/completions", &json!({"model": "kimi-k3", "prompt": words(first), "max_tokens": 2})).await;
    assert_eq!(status, 200, "{text}");
    let deadline = Instant::now() + Duration::from_secs(20);
    while r.metric("kimik3_router_kv_index_blocks", &[("group", "mamba")]).await < 1.0 {
        assert!(Instant::now() < deadline, "the first prompt's KDA state never reached the router: {}", r.log_text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let hits_before = r.metric("kimik3_router_prefix_hit_tokens_total", &[]).await;
    let longer = 5 * block + 3;
    let (status, _, text) =
        post(r.port, "/v1/completions", &json!({"model": "kimi-k3", "prompt": words(longer), "max_tokens": 2})).await;
    assert_eq!(status, 200, "{text}");
    let counted = r.metric("kimik3_router_prefix_hit_tokens_total", &[]).await - hits_before;
    let mut found = Vec::new();
    for p in &prefills {
        let (_, _, stats) = call(p.port, "GET", "/sim/stats", &[], b"").await;
        let stats: Value = serde_json::from_str(&stats).unwrap();
        for rec in stats["by_request_id"].as_object().unwrap().values() {
            if rec["prompt_tokens"].as_u64() == Some(longer as u64) {
                found.push(rec["local_cache_hit_tokens"].as_u64().unwrap());
            }
        }
    }
    assert_eq!(found, vec![(3 * block) as u64], "the longer prompt hit the first one's state where it was routed");
    assert_eq!(counted, (3 * block) as f64, "the router counted the engine's true hit");
    assert!(r.metric("kimik3_router_added_seconds_count", &[("stage", "tokenize")]).await >= 2.0);

    // A chat's next turn: routed by the ids the router kept of its first turn, asking no engine.
    let tokenized = r.metric("kimik3_router_added_seconds_count", &[("stage", "tokenize")]).await;
    let turn1 = vec![json!({"role": "user", "content": words(3 * block + 40)})];
    let (status, _, text) =
        post(r.port, "/v1/chat/completions", &json!({"model": "kimi-k3", "messages": turn1, "max_tokens": 4})).await;
    assert_eq!(status, 200, "{text}");
    let answer = serde_json::from_str::<Value>(&text).unwrap()["choices"][0]["message"]["content"].clone();
    let deadline = Instant::now() + Duration::from_secs(20);
    while r.metric("kimik3_router_kv_index_blocks", &[("group", "mamba")]).await < 2.0 {
        assert!(Instant::now() < deadline, "the first turn's KDA state never reached the router: {}", r.log_text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let hits_before = r.metric("kimik3_router_prefix_hit_tokens_total", &[]).await;
    let mut turn2 = turn1.clone();
    turn2.extend([json!({"role": "assistant", "content": answer}), json!({"role": "user", "content": "and then?"})]);
    let (status, _, text) =
        post(r.port, "/v1/chat/completions", &json!({"model": "kimi-k3", "messages": turn2, "max_tokens": 4})).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(r.metric("kimik3_router_added_seconds_count", &[("stage", "tokenize")]).await, tokenized + 1.0);
    assert_eq!(r.metric("kimik3_router_token_ids_total", &[("source", "continued")]).await, 1.0);
    let counted = r.metric("kimik3_router_prefix_hit_tokens_total", &[]).await - hits_before;
    assert_eq!(counted, (3 * block) as f64, "the second turn was routed to the first one's KDA state");
    // A whole answer tells no ids: the second turn is tokenized after it went, for the third.
    let deadline = Instant::now() + Duration::from_secs(20);
    while r.metric("kimik3_router_token_ids_total", &[("source", "refreshed")]).await < 1.0 {
        assert!(Instant::now() < deadline, "the second turn was never tokenized: {}", r.log_text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let answer = serde_json::from_str::<Value>(&text).unwrap()["choices"][0]["message"]["content"].clone();
    let mut turn3 = turn2.clone();
    turn3.extend([json!({"role": "assistant", "content": answer}), json!({"role": "user", "content": "more"})]);
    let (status, _, text) =
        post(r.port, "/v1/chat/completions", &json!({"model": "kimi-k3", "messages": turn3, "max_tokens": 4})).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(r.metric("kimik3_router_token_ids_total", &[("source", "continued")]).await, 2.0);
    assert_eq!(r.metric("kimik3_router_token_ids_total", &[("source", "prefix_mismatch")]).await, 0.0);
    let _ = std::fs::remove_dir_all(&dir);
}
