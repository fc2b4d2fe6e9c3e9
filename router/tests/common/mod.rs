//! Test world: tiny in-process fake engines (hyper) on 127.0.0.1 ephemeral ports, the router binary
//! as a child process, and a raw HTTP/1.1 client.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::convert::Infallible;
use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

pub type BoxBody = http_body_util::combinators::BoxBody<Bytes, std::io::Error>;

/// How a fake engine answers /v1/* requests.
#[derive(Clone, Debug)]
pub enum Behavior {
    /// A prefill: JSON with fresh kv_transfer_params.
    Prefill,
    /// A decode (or aggregated engine): `chunks` SSE chunks `delay_ms` apart, or one JSON answer.
    Serve { chunks: usize, delay_ms: u64 },
    /// This status with an OpenAI-shaped error body, after reading the request.
    Status(u16),
    /// Read the request, never answer.
    Hang,
    /// Stream `n` chunks, then break the connection.
    CutAfter(usize),
    /// Stream `n` chunks, then go silent (connection open).
    StallAfter(usize),
}

#[derive(Clone, Debug)]
pub struct Seen {
    pub path: String,
    pub headers: HashMap<String, String>,
    pub body: Value,
}

pub struct FakeState {
    pub behavior: Mutex<Behavior>,
    pub seen: Mutex<Vec<Seen>>,
    pub dp: usize,
    pub health_ok: AtomicBool,
    pub health_hang: AtomicBool,
    counter: AtomicU64,
    /// remote_request_id of every kv_transfer_params a decode of this world received.
    pub ledger: Arc<Mutex<Vec<String>>>,
    pub port: u16,
}

pub struct Fake {
    pub port: u16,
    pub state: Arc<FakeState>,
    task: tokio::task::JoinHandle<()>,
}

impl Fake {
    pub async fn start(behavior: Behavior, dp: usize, ledger: Arc<Mutex<Vec<String>>>) -> Fake {
        Self::start_on("127.0.0.1:0", behavior, dp, ledger).await
    }

    pub async fn start_on(addr: &str, behavior: Behavior, dp: usize, ledger: Arc<Mutex<Vec<String>>>) -> Fake {
        let listener = TcpListener::bind(addr).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(FakeState {
            behavior: Mutex::new(behavior),
            seen: Mutex::new(Vec::new()),
            dp,
            health_ok: AtomicBool::new(true),
            health_hang: AtomicBool::new(false),
            counter: AtomicU64::new(0),
            ledger,
            port,
        });
        let st = state.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { continue };
                let st = st.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req| {
                        let st = st.clone();
                        async move { Ok::<_, Infallible>(answer(st, req).await) }
                    });
                    let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), svc).await;
                });
            }
        });
        Fake { port, state, task }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn set(&self, b: Behavior) {
        *self.state.behavior.lock().unwrap() = b;
    }

    /// Stop listening: new connections are refused (the connections it has stay).
    pub fn close(&self) {
        self.task.abort();
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.state.seen.lock().unwrap().clone()
    }

    pub fn completions(&self) -> Vec<Seen> {
        self.seen().into_iter().filter(|s| s.path.starts_with("/v1/")).collect()
    }
}

fn full(v: impl Into<Bytes>) -> BoxBody {
    Full::new(v.into()).map_err(|never| match never {}).boxed()
}

fn json_resp(status: u16, v: &Value) -> Response<BoxBody> {
    let mut r = Response::new(full(serde_json::to_vec(v).unwrap()));
    *r.status_mut() = hyper::StatusCode::from_u16(status).unwrap();
    r.headers_mut().insert("content-type", "application/json".parse().unwrap());
    r
}

async fn answer(st: Arc<FakeState>, req: Request<Incoming>) -> Response<BoxBody> {
    let path = req.uri().path().to_string();
    if path == "/health" {
        if st.health_hang.load(Ordering::Relaxed) {
            std::future::pending::<()>().await;
        }
        let ok = st.health_ok.load(Ordering::Relaxed);
        return json_resp(if ok { 200 } else { 503 }, &json!({}));
    }
    if path == "/metrics" {
        let mut text = String::from("# HELP vllm:num_requests_running x\n");
        for e in 0..st.dp {
            text.push_str(&format!("vllm:num_requests_running{{engine=\"{e}\",model_name=\"kimi-k3\"}} 0\n"));
        }
        return Response::new(full(text));
    }
    let headers: HashMap<String, String> =
        req.headers().iter().map(|(k, v)| (k.as_str().to_string(), v.to_str().unwrap_or("").to_string())).collect();
    let body = req.into_body().collect().await.map(|c| c.to_bytes()).unwrap_or_default();
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    st.seen.lock().unwrap().push(Seen { path: path.clone(), headers: headers.clone(), body: body.clone() });
    let behavior = st.behavior.lock().unwrap().clone();
    let id = format!("cmpl-{}", headers.get("x-request-id").cloned().unwrap_or_default());
    if let Some(rid) = body.pointer("/kv_transfer_params/remote_request_id").and_then(Value::as_str) {
        st.ledger.lock().unwrap().push(rid.to_string());
    }
    let prompt_tokens = 40;
    match behavior {
        Behavior::Prefill => {
            let n = st.counter.fetch_add(1, Ordering::Relaxed);
            let mut choice = json!({"index": 0, "text": "a", "finish_reason": "length",
                "logprobs": {"tokens": ["p0", "p1", "a"], "token_logprobs": [null, -0.5, -0.1], "text_offset": [0, 2, 4]}});
            if body.get("prompt_logprobs").is_some() {
                choice["prompt_logprobs"] = json!([null, {"7": {"logprob": -0.5}}]);
            }
            json_resp(
                200,
                &json!({
                    "id": id, "object": "text_completion", "choices": [choice],
                    "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 1, "total_tokens": prompt_tokens + 1,
                              "prompt_tokens_details": {"cached_tokens": 16}},
                    "kv_transfer_params": {"do_remote_prefill": true, "do_remote_decode": false,
                        "remote_engine_id": format!("engine-{}", st.port), "remote_request_id": format!("{}-{n}", st.port),
                        "remote_block_ids": [[1, 2, 3], [9]], "remote_host": "10.1.2.3", "remote_port": 5600}
                }),
            )
        }
        Behavior::Status(code) => json_resp(
            code,
            &json!({"error": {"message": format!("fake {code}"), "type": "BadRequestError", "param": null, "code": code}}),
        ),
        Behavior::Hang => {
            std::future::pending::<()>().await;
            unreachable!()
        }
        Behavior::Serve { chunks, delay_ms } if body.get("stream") == Some(&json!(true)) => {
            stream_resp(id, chunks, delay_ms, None, &body, prompt_tokens)
        }
        Behavior::Serve { .. } => json_resp(
            200,
            &json!({
                "id": id, "object": "text_completion",
                "choices": [{"index": 0, "text": "hello world", "finish_reason": "stop",
                             "logprobs": {"tokens": ["hello", " world"], "token_logprobs": [-0.1, -0.2], "text_offset": [0, 5]}}],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 2, "total_tokens": prompt_tokens + 2,
                          "prompt_tokens_details": {"cached_tokens": prompt_tokens - 1}},
                "kv_transfer_params": null
            }),
        ),
        Behavior::CutAfter(n) => stream_resp(id, n, 10, Some(false), &body, prompt_tokens),
        Behavior::StallAfter(n) => stream_resp(id, n, 10, Some(true), &body, prompt_tokens),
    }
}

/// `end`: None = finish normally; Some(false) = break the connection; Some(true) = go silent.
fn stream_resp(
    id: String,
    chunks: usize,
    delay_ms: u64,
    end: Option<bool>,
    body: &Value,
    prompt_tokens: u64,
) -> Response<BoxBody> {
    let usage = body.pointer("/stream_options/include_usage") == Some(&json!(true));
    let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(8);
    tokio::spawn(async move {
        for i in 0..chunks {
            let chunk = json!({"id": id, "object": "text_completion", "choices": [{"index": 0, "text": format!("t{i} "), "finish_reason": null}]});
            if tx.send(Ok(Frame::data(Bytes::from(format!("data: {chunk}\n\n"))))).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(delay_ms)).await;
        }
        match end {
            Some(false) => {
                let _ = tx.send(Err(std::io::Error::other("killed"))).await;
                return;
            }
            Some(true) => {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                return;
            }
            None => {}
        }
        if usage {
            let u = json!({"id": id, "choices": [], "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": chunks,
                "total_tokens": prompt_tokens + chunks as u64, "prompt_tokens_details": {"cached_tokens": prompt_tokens - 1}}});
            let _ = tx.send(Ok(Frame::data(Bytes::from(format!("data: {u}\n\n"))))).await;
        }
        let _ = tx.send(Ok(Frame::data(Bytes::from_static(b"data: [DONE]\n\n")))).await;
    });
    let stream = tokio_stream(rx);
    let mut r = Response::new(BodyExt::boxed(StreamBody::new(stream)));
    r.headers_mut().insert("content-type", "text/event-stream".parse().unwrap());
    r
}

/// mpsc receiver as a futures Stream without the futures crate.
fn tokio_stream<T>(rx: mpsc::Receiver<T>) -> RecvStream<T> {
    RecvStream(rx)
}

pub struct RecvStream<T>(pub mpsc::Receiver<T>);

impl<T> futures_core::Stream for RecvStream<T> {
    type Item = T;
    fn poll_next(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Option<T>> {
        self.0.poll_recv(cx)
    }
}

/// Ports handed out in this process: tests run side by side, and a port that is free when one test
/// takes it may be given by the OS to another test's bind before the first test's engine binds it
/// (or after a test kills the engine on it, while its router still routes there).
static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());

/// A free loopback port never handed out before in this process.
pub fn free_port() -> u16 {
    let mut given = GIVEN.lock().unwrap();
    loop {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
}

pub struct Router {
    pub port: u16,
    pub metrics_port: u16,
    pub child: Child,
    pub log: std::path::PathBuf,
}

impl Router {
    pub fn spawn(args: &[String]) -> Router {
        Self::spawn_env(args, &[])
    }

    pub fn spawn_env(args: &[String], env: &[(&str, String)]) -> Router {
        let port = free_port();
        let metrics_port = free_port();
        let log = std::env::temp_dir().join(format!("kimik3-router-test-{port}.log"));
        let out = std::fs::File::create(&log).unwrap();
        let mut full: Vec<String> = vec![
            "--host".into(),
            "127.0.0.1".into(),
            "--port".into(),
            port.to_string(),
            "--metrics-port".into(),
            metrics_port.to_string(),
        ];
        if !args.iter().any(|a| a == "--served-model-name") {
            full.extend(["--served-model-name".into(), "kimi-k3".into()]);
        }
        full.extend(args.iter().cloned());
        let child = Command::new(env!("CARGO_BIN_EXE_kimik3-router"))
            .args(&full)
            .env("RUST_LOG", "debug")
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdout(Stdio::null())
            .stderr(out)
            .spawn()
            .unwrap();
        Router { port, metrics_port, child, log }
    }

    /// Start and wait for /readiness 200.
    pub async fn start(args: &[String]) -> Router {
        let r = Router::spawn(args);
        r.wait_ready(Duration::from_secs(15)).await;
        r
    }

    pub async fn wait_ready(&self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            if let Ok((200, _, _)) = try_call(self.port, "GET", "/readiness", &[], b"").await {
                return;
            }
            assert!(Instant::now() < deadline, "router not ready; log:\n{}", self.log_text());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn log_text(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.log) {
            let _ = f.read_to_string(&mut s);
        }
        s
    }

    pub async fn metrics(&self) -> String {
        call(self.metrics_port, "GET", "/metrics", &[], b"").await.2
    }

    /// The sum of the samples of `name` whose labels contain every `labels` pair.
    pub async fn metric(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let text = self.metrics().await;
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
            .filter(|l| labels.iter().all(|(k, v)| l.contains(&format!("{k}=\"{v}\""))))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    pub fn sigterm(&self) {
        Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status().unwrap();
    }
}

impl Drop for Router {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub async fn try_call(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Result<(u16, HashMap<String, String>, String), String> {
    let stream = TcpStream::connect(("127.0.0.1", port)).await.map_err(|e| e.to_string())?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let mut b = Request::builder().method(method).uri(path).header("host", "router");
    if !body.is_empty() {
        b = b.header("content-type", "application/json");
    }
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let resp = sender
        .send_request(b.body(Full::new(Bytes::copy_from_slice(body))).unwrap())
        .await
        .map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let h =
        resp.headers().iter().map(|(k, v)| (k.as_str().to_string(), v.to_str().unwrap_or("").to_string())).collect();
    let bytes = resp.into_body().collect().await.map(|c| c.to_bytes()).map_err(|e| e.to_string())?;
    Ok((status, h, String::from_utf8_lossy(&bytes).into_owned()))
}

pub async fn call(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, HashMap<String, String>, String) {
    tokio::time::timeout(Duration::from_secs(30), try_call(port, method, path, headers, body))
        .await
        .expect("call timed out")
        .unwrap()
}

pub async fn post(port: u16, path: &str, body: &Value) -> (u16, HashMap<String, String>, String) {
    call(port, "POST", path, &[], &serde_json::to_vec(body).unwrap()).await
}

/// Send raw bytes, return what comes back until the router closes or `wait` passes.
pub async fn raw(port: u16, bytes: &[u8], wait: Duration) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    s.write_all(bytes).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(wait, s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

/// The SSE events of a stream body: JSON values, or the string "[DONE]".
pub fn events(body: &str) -> Vec<Value> {
    body.split("\n\n")
        .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
        .map(|d| {
            if d == "[DONE]" { Value::String("[DONE]".into()) } else { serde_json::from_str(d).unwrap_or(Value::Null) }
        })
        .collect()
}

pub fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

pub fn ledger() -> Arc<Mutex<Vec<String>>> {
    Arc::new(Mutex::new(Vec::new()))
}

pub fn assert_no_reuse(ledger: &Arc<Mutex<Vec<String>>>) {
    let l = ledger.lock().unwrap();
    let mut sorted = l.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), l.len(), "a set of kv_transfer_params reached two decodes: {l:?}");
}

/// The crate's folder, as `cargo test` names it when the test runs (not when it was compiled: a test
/// binary cached in a shared target folder may have been built in another checkout whose sources
/// cargo takes for the same, and that checkout may be gone).
pub fn manifest_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR").map_or_else(|| env!("CARGO_MANIFEST_DIR").into(), std::path::PathBuf::from)
}
