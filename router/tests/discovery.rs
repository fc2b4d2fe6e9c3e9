//! Pod discovery against a fake Kubernetes API server (TLS, test CA in tests/data) on loopback:
//! server-side label selectors, LIST+WATCH, Ready -> routable and terminating -> unrouted within
//! 1 s, a pod replaced under its name, 410 Gone -> relist, token rotation, adds that do not wait
//! for one another.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

mod common;

use bytes::Bytes;
use common::*;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

type Watcher = (String, mpsc::Sender<Result<Frame<Bytes>, std::io::Error>>);

#[derive(Default)]
struct ApiState {
    pods: BTreeMap<String, Value>,
    rv: u64,
    watchers: Vec<Watcher>,
    requests: Vec<(String, String)>,
    lists: usize,
}

type Api = Arc<Mutex<ApiState>>;

fn matches(pod: &Value, selector: &str) -> bool {
    let labels = &pod["metadata"]["labels"];
    selector.split(',').all(|pair| {
        let (k, v) = pair.split_once('=').unwrap();
        labels.get(k).and_then(Value::as_str) == Some(v)
    })
}

fn query_param(query: &str, name: &str) -> Option<String> {
    query
        .split('&')
        .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
        .map(|v| v.replace("%3D", "=").replace("%2C", ",").replace("%2F", "/"))
}

async fn api_answer(api: Api, req: Request<Incoming>) -> Response<BoxBody> {
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    let auth = req.headers().get("authorization").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let selector = query_param(&query, "labelSelector").unwrap_or_default();
    let mut st = api.lock().unwrap();
    st.requests.push((format!("{path}?{query}"), auth));
    assert_eq!(path, "/api/v1/namespaces/serving/pods");
    if query.contains("watch=1") {
        let (tx, rx) = mpsc::channel(64);
        st.watchers.push((selector, tx));
        return Response::new(BodyExt::boxed(StreamBody::new(RecvStream(rx))));
    }
    st.lists += 1;
    let items: Vec<Value> = st.pods.values().filter(|p| matches(p, &selector)).cloned().collect();
    let list = json!({"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": st.rv.to_string()}, "items": items});
    Response::new(Full::new(Bytes::from(serde_json::to_vec(&list).unwrap())).map_err(|n| match n {}).boxed())
}

/// Set a pod and tell the watchers that match it (the way the API server does: only matching pods).
fn put(api: &Api, event: &str, pod: Value) {
    let mut st = api.lock().unwrap();
    st.rv += 1;
    let mut pod = pod;
    pod["metadata"]["resourceVersion"] = json!(st.rv.to_string());
    let name = pod["metadata"]["name"].as_str().unwrap().to_string();
    if event == "DELETED" {
        st.pods.remove(&name);
    } else {
        st.pods.insert(name, pod.clone());
    }
    let line = Bytes::from(format!("{}\n", json!({"type": event, "object": pod})));
    st.watchers.retain(|(sel, tx)| !matches(&pod, sel) || tx.try_send(Ok(Frame::data(line.clone()))).is_ok());
}

fn send_raw(api: &Api, line: Value) {
    let mut st = api.lock().unwrap();
    let line = Bytes::from(format!("{line}\n"));
    st.watchers.retain(|(_, tx)| tx.try_send(Ok(Frame::data(line.clone()))).is_ok());
}

fn end_watches(api: &Api) {
    api.lock().unwrap().watchers.clear();
}

fn pod(name: &str, uid: &str, role: &str, ip: &str, ready: bool) -> Value {
    json!({"metadata": {"name": name, "namespace": "serving", "uid": uid,
                        "labels": {"app": "k3", "role": role, "leaderworkerset.sigs.k8s.io/worker-index": "0"}},
           "status": {"phase": "Running", "podIP": ip,
                      "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}})
}

async fn start_api() -> (Api, u16, PathBuf) {
    let data = manifest_dir().join("tests/data");
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_file_iter(data.join("server.crt")).unwrap().map(|c| c.unwrap()).collect();
    let key = PrivateKeyDer::from_pem_file(data.join("server.key")).unwrap();
    #[allow(deprecated)]
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let api: Api = Arc::new(Mutex::new(ApiState { rv: 100, ..Default::default() }));
    let a = api.clone();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else { continue };
            let (acceptor, a) = (acceptor.clone(), a.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else { return };
                let svc = service_fn(move |req| {
                    let a = a.clone();
                    async move { Ok::<_, Infallible>(api_answer(a, req).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(tls), svc).await;
            });
        }
    });
    let dir = std::env::temp_dir().join(format!("kimik3-router-token-{port}"));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(data.join("ca.crt"), dir.join("ca.crt")).unwrap();
    std::fs::write(dir.join("token"), "token-one\n").unwrap();
    (api, port, dir)
}

async fn until(what: &str, within: Duration, mut f: impl AsyncFnMut() -> bool) -> Duration {
    let started = Instant::now();
    loop {
        if f().await {
            return started.elapsed();
        }
        assert!(started.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn pods_are_followed_by_list_and_watch() {
    let (api, api_port, tokens) = start_api().await;
    let l = ledger();
    // Engines on distinct loopback addresses, one port (as pods share the engine port).
    let p = Fake::start_on("127.0.0.2:0", Behavior::Prefill, 1, l.clone()).await;
    let port = p.port;
    let d1 =
        Fake::start_on(&format!("127.0.0.3:{port}"), Behavior::Serve { chunks: 2, delay_ms: 1 }, 1, l.clone()).await;
    let d2 =
        Fake::start_on(&format!("127.0.0.4:{port}"), Behavior::Serve { chunks: 2, delay_ms: 1 }, 1, l.clone()).await;
    let slow =
        Fake::start_on(&format!("127.0.0.5:{port}"), Behavior::Serve { chunks: 2, delay_ms: 1 }, 1, l.clone()).await;
    slow.state.health_hang.store(true, std::sync::atomic::Ordering::Relaxed);

    put(&api, "ADDED", pod("prefill-0", "u-p", "prefill", "127.0.0.2", true));
    put(&api, "ADDED", pod("decode-0", "u-d1", "decode", "127.0.0.3", false));
    put(&api, "ADDED", pod("other-0", "u-o", "other", "127.0.0.9", true));

    let r = Router::spawn_env(
        &s(&[
            "--namespace",
            "serving",
            "--prefill-selector",
            "app=k3,role=prefill,leaderworkerset.sigs.k8s.io/worker-index=0",
            "--decode-selector",
            "app=k3,role=decode,leaderworkerset.sigs.k8s.io/worker-index=0",
            "--engine-port",
            &port.to_string(),
            "--kube-token-dir",
            tokens.to_str().unwrap(),
            "--health-interval-ms",
            "200",
        ]),
        &[("KUBERNETES_SERVICE_HOST", "127.0.0.1".into()), ("KUBERNETES_SERVICE_PORT", api_port.to_string())],
    );
    let rp = r.port;
    let ready = || async move { matches!(try_call(rp, "GET", "/readiness", &[], b"").await, Ok((200, _, _))) };
    let watching = |n: usize| {
        let api = api.clone();
        move || {
            let api = api.clone();
            async move { api.lock().unwrap().watchers.len() >= n }
        }
    };
    until("both watches open", Duration::from_secs(10), watching(2)).await;
    assert_eq!(try_call(rp, "GET", "/readiness", &[], b"").await.unwrap().0, 503, "no ready decode yet");

    // Server-side selectors and the token.
    {
        let st = api.lock().unwrap();
        assert!(st.requests.iter().all(|(_, auth)| auth == "Bearer token-one"));
        assert!(
            st.requests.iter().any(|(q, _)| q
                .contains("labelSelector=app%3Dk3%2Cleaderworkerset.sigs.k8s.io%2Fworker-index%3D0%2Crole%3Ddecode")),
            "{:?}",
            st.requests
        );
        assert!(st.requests.iter().any(|(q, _)| q.contains("watch=1")
            && q.contains("allowWatchBookmarks=true")
            && q.contains("resourceVersion=103")));
    }

    // Ready -> routable within 1 s, and a second add (whose /health hangs) blocks nothing.
    put(&api, "MODIFIED", pod("decode-slow", "u-s", "decode", "127.0.0.5", true));
    put(&api, "MODIFIED", pod("decode-0", "u-d1", "decode", "127.0.0.3", true));
    let took = until("decode-0 routable", Duration::from_secs(1), ready).await;
    eprintln!("Ready -> routable: {took:?}");
    let (status, _, text) = post(rp, "/v1/completions", &json!({"prompt": "x"})).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(d1.completions().len(), 1);

    // Terminating -> unrouted within 1 s.
    let mut terminating = pod("decode-0", "u-d1", "decode", "127.0.0.3", true);
    terminating["metadata"]["deletionTimestamp"] = json!("2026-12-07T00:00:00Z");
    put(&api, "MODIFIED", terminating);
    let took = until("decode-0 unrouted", Duration::from_secs(1), || async move { !ready().await }).await;
    eprintln!("terminating -> unrouted: {took:?}");
    let (status, _, _) = post(rp, "/v1/completions", &json!({"prompt": "x"})).await;
    assert_eq!(status, 503);

    // Replaced under the same name: new uid, new IP.
    put(&api, "DELETED", pod("decode-0", "u-d1", "decode", "127.0.0.3", true));
    put(&api, "ADDED", pod("decode-0", "u-d2", "decode", "127.0.0.4", true));
    until("the replacement routable", Duration::from_secs(1), ready).await;
    let (status, _, _) = post(rp, "/v1/completions", &json!({"prompt": "y"})).await;
    assert_eq!(status, 200);
    assert_eq!((d1.completions().len(), d2.completions().len()), (1, 1));

    // 410 Gone -> relist; the rotated token is used for it.
    std::fs::write(tokens.join("token"), "token-two\n").unwrap();
    let lists = api.lock().unwrap().lists;
    send_raw(
        &api,
        json!({"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old resource version"}}),
    );
    let a2 = api.clone();
    until("relist after 410", Duration::from_secs(5), move || {
        let a2 = a2.clone();
        async move { a2.lock().unwrap().lists >= lists + 2 } // both roles' watches got the 410
    })
    .await;
    // A watch the server ends is resumed from its resourceVersion (no relist).
    until("watches back", Duration::from_secs(5), watching(2)).await;
    let lists = api.lock().unwrap().lists;
    end_watches(&api);
    until("watches resumed", Duration::from_secs(5), watching(2)).await;
    assert_eq!(api.lock().unwrap().lists, lists);
    assert!(api.lock().unwrap().requests.iter().rev().take(2).all(|(_, auth)| auth == "Bearer token-two"));
    assert!(ready().await);
    // 25 unready/ready flips: 50 events, each within 1 s; the spread is printed.
    let (mut up, mut down) = (Vec::new(), Vec::new());
    for _ in 0..25 {
        put(&api, "MODIFIED", pod("decode-0", "u-d2", "decode", "127.0.0.4", false));
        down.push(until("unready -> unrouted", Duration::from_secs(1), || async move { !ready().await }).await);
        put(&api, "MODIFIED", pod("decode-0", "u-d2", "decode", "127.0.0.4", true));
        up.push(until("ready -> routable", Duration::from_secs(1), ready).await);
    }
    for (what, mut v) in [("Ready -> routable", up), ("unready -> unrouted", down)] {
        v.sort();
        eprintln!("{what} over {} events: p50 {:?}, max {:?}", v.len(), v[v.len() / 2], v[v.len() - 1]);
    }
    // The pod whose /health hangs never became routable, and never delayed the others.
    assert_eq!(r.metric("kimik3_router_engines", &[("role", "decode")]).await, 1.0);
    assert!(slow.completions().is_empty());
}
