//! The router binary against fake engines on loopback.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

mod common;

use common::*;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

fn pd_args(prefills: &[&Fake], decodes: &[&Fake], extra: &[&str]) -> Vec<String> {
    let mut a = s(&["--mode", "pd"]);
    if !extra.contains(&"--health-interval-ms") {
        a.extend(s(&["--health-interval-ms", "200"]));
    }
    for p in prefills {
        a.extend(["--prefill".into(), p.url()]);
    }
    for d in decodes {
        a.extend(["--decode".into(), d.url()]);
    }
    a.extend(s(extra));
    a
}

fn serve() -> Behavior {
    Behavior::Serve { chunks: 4, delay_ms: 5 }
}

#[tokio::test]
async fn handoff_bodies_ids_usage_and_logprobs() {
    let l = ledger();
    let p = Fake::start(Behavior::Prefill, 1, l.clone()).await;
    let d = Fake::start(serve(), 1, l.clone()).await;
    let r = Router::start(&pd_args(&[&p], &[&d], &[])).await;

    let body = json!({"model": "kimi-k3", "prompt": "hello there", "max_tokens": 50, "max_completion_tokens": 50,
                      "min_tokens": 5, "stream": false, "prompt_logprobs": 1, "logprobs": 1,
                      "stream_options": {"include_usage": true}, "kv_transfer_params": {"do_remote_prefill": true, "remote_block_ids": [[666]]}});
    let (status, headers, text) = call(
        r.port,
        "POST",
        "/v1/completions",
        &[("x-request-id", "client-123"), ("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")],
        &serde_json::to_vec(&body).unwrap(),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(headers.get("x-request-id").map(String::as_str), Some("client-123"));
    let answer: Value = serde_json::from_str(&text).unwrap();

    let pseen = p.completions();
    assert_eq!(pseen.len(), 1);
    let pb = &pseen[0].body;
    assert_eq!(pb["max_tokens"], 1);
    // Not a field of vLLM's completions request (its chat's): passed on as given, as vLLM ignores it.
    assert_eq!(pb["max_completion_tokens"], 50);
    assert_eq!(pb["min_tokens"], 1);
    assert_eq!(pb["stream"], false);
    assert!(pb.get("stream_options").is_none());
    assert_eq!(pb["kv_transfer_params"]["do_remote_decode"], true);
    assert_eq!(pb["kv_transfer_params"]["do_remote_prefill"], false);
    assert!(pb["kv_transfer_params"]["remote_block_ids"].is_null(), "the client's own params must not reach an engine");
    assert_eq!(pb["prompt"], "hello there");

    let dseen = d.completions();
    assert_eq!(dseen.len(), 1);
    let db = &dseen[0].body;
    let mut expected = body.clone();
    expected["kv_transfer_params"] = json!({"do_remote_prefill": true, "do_remote_decode": false,
        "remote_engine_id": format!("engine-{}", p.port), "remote_request_id": format!("{}-0", p.port),
        "remote_block_ids": [[1, 2, 3], [9]], "remote_host": "10.1.2.3", "remote_port": 5600});
    assert_eq!(db, &expected, "the decode gets the original body plus the prefill's params verbatim");

    // Ids: each leg its own, neither the client's nor an address; traceparent passed on.
    let (pid, did) = (&pseen[0].headers["x-request-id"], &dseen[0].headers["x-request-id"]);
    assert_ne!(pid, did);
    assert!(!pid.contains("client-123") && !pid.contains("127.0.0.1") && !did.contains("127.0.0.1"));
    assert_eq!(pseen[0].headers["traceparent"], "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01");
    assert_eq!(dseen[0].headers["traceparent"], pseen[0].headers["traceparent"]);
    assert!(!text.contains("127.0.0.1"), "{text}");

    // Usage: the prompt side from the prefill (cached tokens: its prefix hits).
    assert_eq!(answer["usage"]["prompt_tokens"], 40);
    assert_eq!(answer["usage"]["completion_tokens"], 2);
    assert_eq!(answer["usage"]["total_tokens"], 42);
    assert_eq!(answer["usage"]["prompt_tokens_details"]["cached_tokens"], 16);
    // Logprobs: the prefill's prompt logprobs merged into the decode's answer.
    assert_eq!(answer["choices"][0]["prompt_logprobs"], json!([null, {"7": {"logprob": -0.5}}]));
    assert_eq!(answer["choices"][0]["logprobs"]["tokens"], json!(["p0", "p1", "hello", " world"]));
    assert_eq!(answer["choices"][0]["logprobs"]["text_offset"], json!([0, 2, 4, 9]));

    // Streamed: relayed, usage reconciled, [DONE] at the end.
    let stream = json!({"model": "kimi-k3", "prompt": "hi", "max_tokens": 4, "stream": true, "stream_options": {"include_usage": true}});
    let (status, headers, text) = post(r.port, "/v1/completions", &stream).await;
    assert_eq!(status, 200, "{text}");
    assert!(headers["content-type"].starts_with("text/event-stream"));
    let ev = events(&text);
    assert_eq!(ev.last(), Some(&json!("[DONE]")));
    let usage = ev.iter().find(|e| e.get("usage").is_some()).unwrap();
    assert_eq!(usage["usage"]["prompt_tokens_details"]["cached_tokens"], 16);
    assert_eq!(
        ev.iter().filter(|e| e.get("choices").is_some_and(|c| c.as_array().is_some_and(|a| !a.is_empty()))).count(),
        4
    );
    let pb = &p.completions()[1].body;
    assert!(pb.get("stream_options").is_none() && pb["stream"] == false);
    assert_no_reuse(&l);
}

#[tokio::test]
async fn prefill_4xx_is_passed_on_as_is() {
    let l = ledger();
    let p = Fake::start(Behavior::Status(400), 1, l.clone()).await;
    let d = Fake::start(serve(), 1, l.clone()).await;
    let r = Router::start(&pd_args(&[&p], &[&d], &[])).await;
    let (status, _, text) =
        post(r.port, "/v1/chat/completions", &json!({"messages": [{"role": "user", "content": "x"}]})).await;
    assert_eq!(status, 400);
    assert_eq!(serde_json::from_str::<Value>(&text).unwrap()["error"]["message"], "fake 400");
    assert!(d.completions().is_empty(), "a refused prefill must not reach a decode");
}

#[tokio::test]
async fn decode_that_refuses_the_connect_gets_replaced_with_the_same_params() {
    let l = ledger();
    let p = Fake::start(Behavior::Prefill, 1, l.clone()).await;
    let dead = Fake::start(serve(), 1, l.clone()).await;
    let live = Fake::start(serve(), 1, l.clone()).await;
    // Probes slow enough that the router learns of the dead decode only from its requests.
    let args = pd_args(
        &[&p],
        &[&dead, &live],
        &["--decode-policy", "round_robin", "--eject-after", "100", "--health-interval-ms", "600000"],
    );
    let r = Router::start(&args).await;
    dead.close();
    for i in 0..4 {
        let (status, _, text) =
            post(r.port, "/v1/completions", &json!({"prompt": format!("p{i}"), "max_tokens": 3})).await;
        assert_eq!(status, 200, "{text}");
    }
    assert_eq!(p.completions().len(), 4, "a decode that never took the request needs no second prefill");
    assert_eq!(live.completions().len(), 4);
    assert!(r.metric("kimik3_router_retries_total", &[("kind", "decode_same_params")]).await >= 1.0);
    assert_eq!(r.metric("kimik3_router_retries_total", &[("kind", "reprefill")]).await, 0.0);
    assert_no_reuse(&l);
}

#[tokio::test]
async fn decode_failing_after_the_send_gets_fresh_params() {
    let l = ledger();
    let p = Fake::start(Behavior::Prefill, 1, l.clone()).await;
    let bad = Fake::start(Behavior::Status(500), 1, l.clone()).await;
    let good = Fake::start(serve(), 1, l.clone()).await;
    let r = Router::start(&pd_args(
        &[&p],
        &[&bad, &good],
        &["--decode-policy", "round_robin", "--eject-after", "100", "--retry-budget-floor", "100"],
    ))
    .await;
    for i in 0..4 {
        for stream in [false, true] {
            let (status, _, text) =
                post(r.port, "/v1/completions", &json!({"prompt": format!("q{i}"), "max_tokens": 3, "stream": stream}))
                    .await;
            assert_eq!(status, 200, "{text}");
        }
    }
    let bad_params: Vec<Value> = bad.completions().iter().map(|s| s.body["kv_transfer_params"].clone()).collect();
    let good_params: Vec<Value> = good.completions().iter().map(|s| s.body["kv_transfer_params"].clone()).collect();
    assert!(!bad_params.is_empty(), "round robin must have tried the failing decode");
    assert_eq!(good_params.len(), 8);
    for bp in &bad_params {
        assert!(!good_params.contains(bp), "params a decode may have read were given to another decode");
    }
    assert_eq!(p.completions().len(), 8 + bad_params.len(), "one fresh prefill per failed decode leg");
    assert!(r.metric("kimik3_router_retries_total", &[("kind", "reprefill")]).await >= 1.0);
    assert_no_reuse(&l);
}

#[tokio::test]
async fn prefill_failure_is_retried_on_another_prefill() {
    let l = ledger();
    let bad = Fake::start(Behavior::Status(503), 1, l.clone()).await;
    let good = Fake::start(Behavior::Prefill, 1, l.clone()).await;
    let d = Fake::start(serve(), 1, l.clone()).await;
    let r =
        Router::start(&pd_args(&[&bad, &good], &[&d], &["--prefill-policy", "round_robin", "--eject-after", "100"]))
            .await;
    for i in 0..4 {
        let (status, _, text) =
            post(r.port, "/v1/chat/completions", &json!({"messages": [{"role": "user", "content": format!("m{i}")}]}))
                .await;
        assert_eq!(status, 200, "{text}");
    }
    assert!(!bad.completions().is_empty());
    assert_eq!(good.completions().len(), 4);
    assert!(r.metric("kimik3_router_retries_total", &[("kind", "prefill")]).await >= 1.0);
}

#[tokio::test]
async fn a_cut_stream_ends_with_an_error_event() {
    let l = ledger();
    let p = Fake::start(Behavior::Prefill, 1, l.clone()).await;
    let d = Fake::start(Behavior::CutAfter(2), 1, l.clone()).await;
    let r = Router::start(&pd_args(&[&p], &[&d], &[])).await;
    let (status, _, text) =
        post(r.port, "/v1/chat/completions", &json!({"messages": [{"role": "user", "content": "x"}], "stream": true}))
            .await;
    assert_eq!(status, 200);
    let ev = events(&text);
    assert_eq!(ev.len(), 4, "{text}");
    assert_eq!(ev[0]["choices"][0]["text"], "t0 ");
    let err = &ev[2]["error"];
    assert!(err["message"].as_str().unwrap().contains("stream broke"), "{text}");
    assert_eq!(err["type"], "upstream_error");
    assert_eq!(err["code"], 502);
    assert!(err.get("param").is_some());
    assert_eq!(ev[3], json!("[DONE]"));
    assert_eq!(r.metric("kimik3_router_streams_cut_total", &[("reason", "upstream_error")]).await, 1.0);
    assert_eq!(p.completions().len(), 1, "after a token reached the client nothing is retried");
}

#[tokio::test]
async fn an_engine_that_accepts_and_never_answers_is_failed_over() {
    // Probes stay healthy: only the watchdogs can tell. A stream's first-token deadline; a whole
    // answer's is that plus max_tokens idle gaps (here 0.4 s + 3 x 0.2 s), the longest a stream of
    // that length could take without its idle-gap watchdog cutting it.
    let l = ledger();
    let p = Fake::start(Behavior::Prefill, 1, l.clone()).await;
    let hung = Fake::start(Behavior::Hang, 1, l.clone()).await;
    let good = Fake::start(serve(), 1, l.clone()).await;
    let r = Router::start(&pd_args(
        &[&p],
        &[&hung, &good],
        &[
            "--decode-policy",
            "round_robin",
            "--first-token-timeout-secs",
            "0.4",
            "--idle-gap-timeout-secs",
            "0.2",
            "--prefill-tokens-per-sec",
            "1000000",
            "--eject-after",
            "100",
        ],
    ))
    .await;
    let mut hung_legs = 0;
    for (stream, outcome) in [(true, "first_token_timeout"), (false, "answer_timeout")] {
        let started = Instant::now();
        let before = hung.completions().len();
        for i in 0..2 {
            let body = json!({"prompt": format!("w{i}{stream}"), "max_tokens": 3, "stream": stream});
            let (status, _, text) = post(r.port, "/v1/completions", &body).await;
            assert_eq!(status, 200, "{text}");
            if stream {
                assert_eq!(events(&text).last(), Some(&json!("[DONE]")));
            }
            assert!(!text.contains("\"error\""), "{text}");
        }
        assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
        let struck = hung.completions().len() - before;
        assert!(struck >= 1, "round robin must have tried the hung decode");
        assert_eq!(r.metric("kimik3_router_leg_requests_total", &[("outcome", outcome)]).await, struck as f64);
        hung_legs += struck;
    }
    assert_eq!(good.completions().len(), 4);
    assert_eq!(p.completions().len(), 4 + hung_legs, "a decode that took the request and hung costs a fresh prefill");
    assert_no_reuse(&l);
}

#[tokio::test]
async fn a_non_streamed_request_on_an_engine_whose_probes_fail_is_failed_over() {
    let l = ledger();
    let p = Fake::start(Behavior::Prefill, 1, l.clone()).await;
    let hung = Fake::start(Behavior::Hang, 1, l.clone()).await;
    let good = Fake::start(serve(), 1, l.clone()).await;
    let r = Router::start(&pd_args(
        &[&p],
        &[&hung, &good],
        &["--decode-policy", "round_robin", "--health-timeout-ms", "200"],
    ))
    .await;
    let port = r.port;
    let waiting = tokio::spawn(async move {
        let mut out = Vec::new();
        for i in 0..2 {
            out.push(post(port, "/v1/completions", &json!({"prompt": format!("n{i}"), "max_tokens": 3})).await);
        }
        out
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    hung.state.health_hang.store(true, std::sync::atomic::Ordering::Relaxed);
    let results = tokio::time::timeout(Duration::from_secs(10), waiting).await.expect("requests stuck").unwrap();
    for (status, _, text) in results {
        assert_eq!(status, 200, "{text}");
    }
    assert_eq!(good.completions().len(), 2);
    assert_no_reuse(&l);
}

#[tokio::test]
async fn a_stall_mid_stream_ends_it_with_an_error_event() {
    let l = ledger();
    let p = Fake::start(Behavior::Prefill, 1, l.clone()).await;
    let d = Fake::start(Behavior::StallAfter(2), 1, l.clone()).await;
    let r = Router::start(&pd_args(&[&p], &[&d], &["--idle-gap-timeout-secs", "0.5"])).await;
    let started = Instant::now();
    let (status, _, text) = post(r.port, "/v1/completions", &json!({"prompt": "x", "stream": true})).await;
    assert_eq!(status, 200);
    assert!(started.elapsed() < Duration::from_secs(5));
    let ev = events(&text);
    assert_eq!(ev.len(), 4, "{text}");
    assert_eq!(ev[2]["error"]["code"], 504);
    assert_eq!(ev[2]["error"]["type"], "timeout");
    assert_eq!(ev[3], json!("[DONE]"));
    assert_eq!(r.metric("kimik3_router_streams_cut_total", &[("reason", "idle_gap")]).await, 1.0);
}

#[tokio::test]
async fn the_retry_budget_stops_a_fleet_wide_failure_from_multiplying_load() {
    let l = ledger();
    let p = Fake::start(Behavior::Prefill, 1, l.clone()).await;
    let d1 = Fake::start(Behavior::Status(500), 1, l.clone()).await;
    let d2 = Fake::start(Behavior::Status(500), 1, l.clone()).await;
    let r = Router::start(&pd_args(
        &[&p],
        &[&d1, &d2],
        &["--max-retries", "5", "--retry-budget-ratio", "0", "--retry-budget-floor", "2", "--eject-after", "1000"],
    ))
    .await;
    for i in 0..5 {
        let (status, _, text) = post(r.port, "/v1/completions", &json!({"prompt": format!("b{i}")})).await;
        assert_eq!(status, 502, "{text}");
        let e: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(e["error"]["type"], "upstream_error");
        assert_eq!(e["error"]["code"], 502);
    }
    let legs = d1.completions().len() + d2.completions().len();
    assert_eq!(legs, 5 + 2, "5 requests, 2 retries allowed by the budget's floor");
    assert!(r.metric("kimik3_router_retry_budget_exhausted_total", &[]).await >= 3.0);
}

#[tokio::test]
async fn consecutive_failures_eject_an_engine() {
    let l = ledger();
    let p = Fake::start(Behavior::Prefill, 1, l.clone()).await;
    let bad = Fake::start(Behavior::Status(500), 1, l.clone()).await;
    let good = Fake::start(serve(), 1, l.clone()).await;
    let r = Router::start(&pd_args(
        &[&p],
        &[&bad, &good],
        &["--decode-policy", "round_robin", "--eject-after", "2", "--eject-secs", "60"],
    ))
    .await;
    for i in 0..10 {
        let (status, _, text) = post(r.port, "/v1/completions", &json!({"prompt": format!("e{i}")})).await;
        assert_eq!(status, 200, "{text}");
    }
    assert_eq!(bad.completions().len(), 2, "ejected after 2 consecutive failures");
    assert_eq!(r.metric("kimik3_router_engine_ejections_total", &[("role", "decode")]).await, 1.0);
    let engine = format!("127.0.0.1:{}", bad.port);
    assert_eq!(r.metric("kimik3_router_engine_healthy", &[("engine", &engine)]).await, 0.0);
}

#[tokio::test]
async fn data_parallel_ranks_are_pinned_by_header() {
    let l = ledger();
    let p = Fake::start(Behavior::Prefill, 2, l.clone()).await;
    let d = Fake::start(serve(), 2, l.clone()).await;
    let r =
        Router::start(&pd_args(&[&p], &[&d], &["--prefill-policy", "round_robin", "--decode-policy", "round_robin"]))
            .await;
    for i in 0..4 {
        let (status, _, _) = post(r.port, "/v1/completions", &json!({"prompt": format!("r{i}")})).await;
        assert_eq!(status, 200);
    }
    let ranks = |f: &Fake| {
        let mut r: Vec<String> = f
            .completions()
            .iter()
            .map(|s| s.headers.get("x-data-parallel-rank").cloned().unwrap_or_default())
            .collect();
        r.sort();
        r
    };
    assert_eq!(ranks(&p), vec!["0", "0", "1", "1"]);
    assert_eq!(ranks(&d), vec!["0", "0", "1", "1"]);
    assert_eq!(r.metric("kimik3_router_engines", &[("role", "decode")]).await, 2.0);
}

#[tokio::test]
async fn models_routes_and_error_shapes() {
    let l = ledger();
    let p = Fake::start(Behavior::Prefill, 1, l.clone()).await;
    let d = Fake::start(serve(), 1, l.clone()).await;
    let mut args = pd_args(&[&p], &[&d], &[]);
    args.extend(s(&["--served-model-name", "moonshotai/Kimi-K3"]));
    let r = Router::start(&args).await;
    let (status, _, text) = call(r.port, "GET", "/v1/models", &[], b"").await;
    assert_eq!(status, 200);
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], "moonshotai/Kimi-K3");
    let (status, _, text) = call(r.port, "GET", "/v1/models/moonshotai/Kimi-K3", &[], b"").await;
    assert_eq!(
        (status, serde_json::from_str::<Value>(&text).unwrap()["id"].clone()),
        (200, json!("moonshotai/Kimi-K3"))
    );
    let (status, _, text) = call(r.port, "GET", "/v1/models/moonshotai%2FKimi-K3", &[], b"").await;
    assert_eq!(status, 200, "{text}");
    let shape = |text: &str, code: u64| {
        let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"));
        let e = &v["error"];
        assert!(e["message"].is_string() && e["type"].is_string() && e.get("param").is_some(), "{text}");
        assert_eq!(e["code"], code, "{text}");
    };
    for (method, path, code) in [
        ("GET", "/v1/models/other", 404),
        ("GET", "/workers", 404),
        ("POST", "/v1/models", 404),
        ("GET", "/v1/chat/completions", 404),
        ("POST", "/v1/messages", 501),
        ("DELETE", "/workers/x", 404),
        ("GET", "//v1/models", 404),
        ("GET", "/v1%2Fmodels", 404),
        ("GET", "/v1/models/../../workers", 404),
    ] {
        let (status, _, text) = call(r.port, method, path, &[], b"").await;
        assert_eq!(status as u64, code, "{method} {path}: {text}");
        shape(&text, code);
    }
    let (status, _, text) = post(r.port, "/v1/completions", &json!({"model": "gpt-4", "prompt": "x"})).await;
    assert_eq!(status, 404);
    shape(&text, 404);
    assert!(p.completions().is_empty());
    for path in ["/health", "/liveness", "/readiness"] {
        assert_eq!(call(r.port, "GET", path, &[], b"").await.0, 200, "{path}");
    }
}

#[tokio::test]
async fn readiness_needs_a_prefill_and_a_decode() {
    let l = ledger();
    let p = Fake::start(Behavior::Prefill, 1, l.clone()).await;
    let closed = free_port();
    let r = Router::spawn(&s(&["--prefill", &p.url(), "--decode", &format!("http://127.0.0.1:{closed}")]));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (status, _, text) = call(r.port, "GET", "/readiness", &[], b"").await;
    assert_eq!(status, 503, "{text}");
    assert_eq!(call(r.port, "GET", "/liveness", &[], b"").await.0, 200);
    let (status, _, text) = post(r.port, "/v1/completions", &json!({"prompt": "x"})).await;
    assert_eq!(status, 503);
    assert!(text.contains("no healthy decode engine"), "{text}");
}

#[tokio::test]
async fn hostile_input_gets_clear_errors_and_disturbs_no_other_stream() {
    let l = ledger();
    let p = Fake::start(Behavior::Prefill, 1, l.clone()).await;
    let d = Fake::start(Behavior::Serve { chunks: 30, delay_ms: 50 }, 1, l.clone()).await;
    let r = Router::start(&pd_args(
        &[&p],
        &[&d],
        &["--max-payload-size", "10000", "--header-timeout-secs", "1", "--body-timeout-secs", "1"],
    ))
    .await;
    let port = r.port;
    let long =
        tokio::spawn(async move { post(port, "/v1/completions", &json!({"prompt": "long", "stream": true})).await });
    tokio::time::sleep(Duration::from_millis(200)).await;

    let (status, _, text) = call(r.port, "POST", "/v1/completions", &[], b"{\"prompt\": ").await;
    assert_eq!(status, 400);
    assert!(text.contains("not valid JSON"), "{text}");
    let (status, _, text) = call(r.port, "POST", "/v1/completions", &[], b"[1, 2]").await;
    assert_eq!(status, 400, "{text}");
    let big = json!({"prompt": "x".repeat(20000)});
    let (status, _, text) = post(r.port, "/v1/completions", &big).await;
    assert_eq!(status, 413, "{text}");
    assert_eq!(serde_json::from_str::<Value>(&text).unwrap()["error"]["code"], 413);
    // Chunked, no Content-Length: the cap holds while the body streams in.
    let mut chunked = b"POST /v1/completions HTTP/1.1\r\nHost: r\r\nTransfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\n".to_vec();
    for _ in 0..30 {
        chunked.extend_from_slice(b"3e8\r\n");
        chunked.extend_from_slice(&[b' '; 1000]);
        chunked.extend_from_slice(b"\r\n");
    }
    let reply = raw(r.port, &chunked, Duration::from_secs(3)).await;
    assert!(reply.starts_with("HTTP/1.1 413"), "{reply}");
    // A whole chunked body far over the cap, sent before reading: the router reads the rest and drops
    // it, so the client (in a pod, the front) gets its 413 and not a reset with the answer unread.
    let mut whole =
        b"POST /v1/completions HTTP/1.1\r\nHost: r\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n".to_vec();
    for _ in 0..64 {
        whole.extend_from_slice(b"8000\r\n");
        whole.extend_from_slice(&[b' '; 0x8000]);
        whole.extend_from_slice(b"\r\n");
    }
    whole.extend_from_slice(b"0\r\n\r\n");
    for _ in 0..5 {
        let reply = raw(r.port, &whole, Duration::from_secs(3)).await;
        assert!(reply.starts_with("HTTP/1.1 413") && reply.contains("\"code\":413"), "{reply}");
    }
    // Absolute-form and oversized headers.
    let reply = raw(r.port, b"GET http://evil/v1/models HTTP/1.1\r\nHost: evil\r\n\r\n", Duration::from_secs(2)).await;
    assert!(reply.starts_with("HTTP/1.1 400"), "{reply}");
    let mut huge = b"GET /v1/models HTTP/1.1\r\nHost: r\r\nX-Big: ".to_vec();
    huge.extend(std::iter::repeat_n(b'a', 200_000));
    huge.extend_from_slice(b"\r\n\r\n");
    let reply = raw(r.port, &huge, Duration::from_secs(2)).await;
    assert!(reply.is_empty() || reply.starts_with("HTTP/1.1 431") || reply.starts_with("HTTP/1.1 400"), "{reply}");
    // A client that sends half its headers and waits: closed after the header timeout.
    let started = Instant::now();
    let reply = raw(r.port, b"GET /v1/models HTTP/1.1\r\nHost:", Duration::from_secs(5)).await;
    assert!(started.elapsed() < Duration::from_secs(4), "an idle half-request was held {:?}", started.elapsed());
    assert!(!reply.contains("200 OK"));
    // An idle kept-alive connection is closed after the header timeout too.
    let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", r.port)).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut conn, b"GET /health HTTP/1.1\r\nHost: r\r\n\r\n").await.unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tokio::io::AsyncReadExt::read(&mut conn, &mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    let idle = Instant::now();
    let n = tokio::time::timeout(Duration::from_secs(5), tokio::io::AsyncReadExt::read(&mut conn, &mut buf)).await;
    assert!(matches!(n, Ok(Ok(0))) && idle.elapsed() < Duration::from_secs(3), "{n:?} after {:?}", idle.elapsed());
    // A body that never comes: 408.
    let reply = raw(
        r.port,
        b"POST /v1/completions HTTP/1.1\r\nHost: r\r\nContent-Length: 100\r\n\r\n{\"pro",
        Duration::from_secs(5),
    )
    .await;
    assert!(reply.starts_with("HTTP/1.1 408"), "{reply}");

    let (status, _, text) = long.await.unwrap();
    assert_eq!(status, 200);
    let ev = events(&text);
    assert_eq!(ev.len(), 31, "the other stream must finish whole: {text}");
    assert!(!text.contains("\"error\""));
    assert!(r.log_text().lines().all(|l| !l.contains("panicked")), "{}", r.log_text());
    assert!(r.child_alive());
}

trait Alive {
    fn child_alive(&self) -> bool;
}

impl Alive for Router {
    fn child_alive(&self) -> bool {
        std::process::Command::new("kill")
            .args(["-0", &self.child.id().to_string()])
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    }
}

#[tokio::test]
async fn drain_finishes_streams_in_flight_and_refuses_new_ones() {
    let l = ledger();
    let p = Fake::start(Behavior::Prefill, 1, l.clone()).await;
    let d = Fake::start(Behavior::Serve { chunks: 20, delay_ms: 50 }, 1, l.clone()).await;
    let mut r = Router::start(&pd_args(&[&p], &[&d], &["--drain-secs", "10"])).await;
    let port = r.port;
    let long =
        tokio::spawn(async move { post(port, "/v1/completions", &json!({"prompt": "long", "stream": true})).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    r.sigterm();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(try_call(r.port, "GET", "/health", &[], b"").await.is_err(), "a draining router must not accept");
    let (status, _, text) = long.await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(events(&text).len(), 21, "{text}");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(code) = r.child.try_wait().unwrap() {
            assert!(code.success(), "{code:?}");
            break;
        }
        assert!(Instant::now() < deadline, "the router did not exit after its drain");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn aggregated_mode_proxies_and_fails_over() {
    let l = ledger();
    let bad = Fake::start(Behavior::Status(500), 1, l.clone()).await;
    let good = Fake::start(serve(), 1, l.clone()).await;
    let r = Router::start(&s(&[
        "--mode",
        "aggregated",
        "--policy",
        "round_robin",
        "--worker",
        &bad.url(),
        "--worker",
        &good.url(),
        "--eject-after",
        "100",
    ]))
    .await;
    for i in 0..4 {
        let body = json!({"prompt": format!("a{i}"), "stream": i % 2 == 0, "kv_transfer_params": {"x": 1}});
        let (status, _, text) = post(r.port, "/v1/completions", &body).await;
        assert_eq!(status, 200, "{text}");
    }
    assert_eq!(good.completions().len(), 4);
    assert!(good.completions().iter().all(|s| s.body.get("kv_transfer_params").is_none()));
    assert!(r.metric("kimik3_router_retries_total", &[("kind", "aggregated")]).await >= 1.0);
}

#[test]
fn check_args_exit_codes() {
    let run = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_kimik3-router"))
            .arg("--check-args")
            .args(args)
            .output()
            .unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let ok = [
        "--served-model-name",
        "m",
        "--mode",
        "pd",
        "--namespace",
        "ns",
        "--prefill-selector",
        "a=b,c=d",
        "--decode-selector",
        "a=b,c=e",
        "--prefill-policy",
        "cache_aware",
        "--decode-policy",
        "round_robin",
        "--max-payload-size",
        "1048576",
        "--drain-secs",
        "30",
    ];
    assert_eq!(run(&ok), (Some(0), String::new()));
    assert_eq!(
        run(&[
            "--served-model-name",
            "m",
            "--mode",
            "aggregated",
            "--namespace",
            "ns",
            "--selector",
            "a=b",
            "--policy",
            "random"
        ])
        .0,
        Some(0)
    );
    for (args, needle) in [
        (&["--served-model-name", "m", "--frobnicate", "1"][..], "unknown flag --frobnicate"),
        (&["--served-model-name", "m", "--mode", "pd", "--prefill-selector"][..], "needs a value"),
        (
            &["--served-model-name", "m", "--mode", "pd", "--namespace", "n", "--prefill-selector", "a=b"][..],
            "--decode-selector",
        ),
        (
            &["--served-model-name", "m", "--prefill", "http://a:1", "--decode", "http://b:1", "--port", "99999"][..],
            "not a valid number",
        ),
        (
            &[
                "--served-model-name",
                "m",
                "--prefill",
                "http://a:1",
                "--decode",
                "http://b:1",
                "--prefill-policy",
                "power_of_two",
            ][..],
            "unknown policy",
        ),
        (&["--served-model-name", "m", "--mode", "sideways"][..], "--mode"),
    ] {
        let (code, err) = run(args);
        assert_eq!(code, Some(2), "{args:?}");
        assert!(err.contains(needle) && err.lines().count() == 1, "{args:?}: {err}");
    }
}

/// Every span the fake collector received, across its export requests.
fn spans(collector: &Fake) -> Vec<Value> {
    collector
        .seen()
        .into_iter()
        .filter(|s| {
            s.path == "/v1/traces" && s.headers.get("content-type").map(String::as_str) == Some("application/json")
        })
        .flat_map(|s| s.body["resourceSpans"][0]["scopeSpans"][0]["spans"].as_array().cloned().unwrap_or_default())
        .collect()
}

fn attr<'a>(span: &'a Value, key: &str) -> Option<&'a Value> {
    span["attributes"].as_array()?.iter().find(|a| a["key"] == key).map(|a| &a["value"])
}

async fn wait_spans(collector: &Fake, n: usize) -> Vec<Value> {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let got = spans(collector);
        if got.len() >= n || Instant::now() > until {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn spans_of_a_request_and_its_legs_reach_the_collector_and_the_engines_nest_under_them() {
    let l = ledger();
    let collector = Fake::start(Behavior::Status(200), 1, l.clone()).await;
    let p = Fake::start(Behavior::Prefill, 1, l.clone()).await;
    let dead = Fake::start(serve(), 1, l.clone()).await;
    let live = Fake::start(serve(), 1, l.clone()).await;
    let endpoint = format!("http://127.0.0.1:{}/v1/traces", collector.port);
    let args = pd_args(
        &[&p],
        &[&dead, &live],
        &[
            "--decode-policy",
            "round_robin",
            "--eject-after",
            "100",
            "--health-interval-ms",
            "600000",
            "--otlp-traces-endpoint",
            &endpoint,
            "--trace-sample-ratio",
            "0",
        ],
    );
    let r = Router::start(&args).await;
    dead.close();
    let client_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let mut streamed = 0;
    for i in 0..2 {
        let body = json!({"model": "kimi-k3", "prompt": format!("p{i}"), "max_tokens": 3, "stream": true});
        let (status, _, text) = call(
            r.port,
            "POST",
            "/v1/completions",
            &[("traceparent", &format!("00-{client_trace}-00f067aa0ba902b7-01")), ("tracestate", "k3=x")],
            &serde_json::to_vec(&body).unwrap(),
        )
        .await;
        assert_eq!(status, 200, "{text}");
        streamed += events(&text).len();
    }
    assert!(streamed > 0);
    // Two requests: a server span each, a prefill each, a decode each on the live engine, and a
    // refused decode leg for each request round robin sent to the closed engine first (one or two).
    wait_spans(&collector, 7).await;
    tokio::time::sleep(Duration::from_millis(1500)).await; // a second batch, if any
    let got = spans(&collector);
    let refused = got.iter().filter(|s| s["status"]["code"] == 2).count();
    assert!((1..=2).contains(&refused) && got.len() == 6 + refused, "{got:#?}");
    assert!(got.iter().all(|s| s["traceId"] == client_trace));
    let servers: Vec<&Value> = got.iter().filter(|s| s["kind"] == 2).collect();
    assert_eq!(servers.len(), 2);
    for server in &servers {
        assert_eq!(server["parentSpanId"], "00f067aa0ba902b7");
        assert_eq!(server["name"], "POST /v1/completions");
        assert!(server["status"].get("code").is_none(), "{server}"); // UNSET: not failed
        assert_eq!(attr(server, "http.response.status_code"), Some(&json!({"intValue": "200"})));
        let legs: Vec<&Value> = got.iter().filter(|s| s["parentSpanId"] == server["spanId"]).collect();
        assert!(legs.iter().all(|s| s["kind"] == 3));
        let end = |s: &Value| s["endTimeUnixNano"].as_str().unwrap().parse::<u64>().unwrap();
        assert!(legs.iter().all(|leg| end(leg) <= end(server)), "a leg outlived its request's span");
    }
    for failed in got.iter().filter(|s| s["status"]["code"] == 2) {
        assert_eq!(attr(failed, "kimik3.outcome"), Some(&json!({"stringValue": "connect_failed"})));
        assert_eq!(attr(failed, "kimik3.role"), Some(&json!({"stringValue": "decode"})));
    }
    // Each engine saw a traceparent naming its own leg's span, the caller's trace and flags, and the
    // caller's tracestate.
    for (engine, role) in [(&p, "prefill"), (&live, "decode")] {
        for seen in engine.completions() {
            let parent = seen.headers["traceparent"].clone();
            let leg = got
                .iter()
                .find(|s| parent == format!("00-{client_trace}-{}-01", s["spanId"].as_str().unwrap()))
                .unwrap_or_else(|| panic!("{parent} names no exported span"));
            assert_eq!(attr(leg, "kimik3.role"), Some(&json!({"stringValue": role})));
            assert_eq!(seen.headers["tracestate"], "k3=x");
        }
    }
    assert_eq!(r.metric("kimik3_router_spans_total", &[("outcome", "exported")]).await, got.len() as f64);

    // A caller that did not sample: nothing recorded, its trace and flag passed on under new ids.
    let before = spans(&collector).len();
    let (status, _, _) = call(
        r.port,
        "POST",
        "/v1/completions",
        &[("traceparent", &format!("00-{client_trace}-00f067aa0ba902b7-00"))],
        &serde_json::to_vec(&json!({"prompt": "quiet", "max_tokens": 3})).unwrap(),
    )
    .await;
    assert_eq!(status, 200);
    // No caller trace at ratio 0: a trace of the router's own, not sampled.
    let (status, _, _) = post(r.port, "/v1/completions", &json!({"prompt": "fresh", "max_tokens": 3})).await;
    assert_eq!(status, 200);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(spans(&collector).len(), before, "an unsampled request was exported");
    let last = p.completions();
    let quiet = &last[last.len() - 2].headers["traceparent"];
    assert!(
        quiet.starts_with(&format!("00-{client_trace}-"))
            && quiet.ends_with("-00")
            && !quiet.contains("00f067aa0ba902b7")
    );
    let fresh = &last[last.len() - 1].headers["traceparent"];
    assert!(fresh.ends_with("-00") && !fresh.contains(client_trace), "{fresh}");
}

#[tokio::test]
async fn without_an_endpoint_the_callers_trace_headers_pass_unchanged() {
    let l = ledger();
    let p = Fake::start(Behavior::Prefill, 1, l.clone()).await;
    let d = Fake::start(serve(), 1, l.clone()).await;
    let r = Router::start(&pd_args(&[&p], &[&d], &[])).await;
    let parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let (status, _, _) = call(
        r.port,
        "POST",
        "/v1/completions",
        &[("traceparent", parent)],
        &serde_json::to_vec(&json!({"prompt": "x", "max_tokens": 3})).unwrap(),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(p.completions()[0].headers["traceparent"], parent);
    assert_eq!(d.completions()[0].headers["traceparent"], parent);
}
