//! Pod discovery: LIST then WATCH the pods of one namespace with a server-side `labelSelector`,
//! one stream per role. Bookmarks keep the resourceVersion fresh; `410 Gone` relists; a broken
//! connection is re-established with back-off. A pod is routable once it is Running, Ready, not
//! being deleted and has an IP; it leaves at once when any of that stops. A pod replaced under the
//! same name (new uid or IP) replaces the old entry. Each new engine is admitted on its own task,
//! so no add waits behind another.
//!
//! Credentials: in-cluster (KUBERNETES_SERVICE_HOST/PORT; token and ca.crt from the token
//! directory, --kube-token-dir). The token file is read again for every request to the API server
//! (a watch lasts at most WATCH_SECONDS), so a rotated projected token is picked up.

use crate::config::{Config, Selector};
use crate::engines::{self, Endpoint, Registry, Role};
use crate::metrics::METRICS;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::Request;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::Value;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;

const WATCH_SECONDS: u64 = 240;
const MAX_LINE: usize = 32 << 20;

pub struct Api {
    host: String,
    port: u16,
    token_dir: String,
}

impl Api {
    pub fn from_env(cfg: &Config) -> Result<Self, String> {
        let host = std::env::var("KUBERNETES_SERVICE_HOST")
            .map_err(|_| "discovery needs KUBERNETES_SERVICE_HOST (in-cluster configuration)".to_string())?;
        let port = std::env::var("KUBERNETES_SERVICE_PORT").unwrap_or_else(|_| "443".into());
        let port = port.parse::<u16>().map_err(|_| format!("KUBERNETES_SERVICE_PORT {port:?} is not a port"))?;
        Ok(Self { host, port, token_dir: cfg.kube_token_dir.clone() })
    }

    fn tls(&self) -> Result<(tokio_rustls::TlsConnector, ServerName<'static>), String> {
        let ca = format!("{}/ca.crt", self.token_dir);
        let mut roots = rustls::RootCertStore::empty();
        let certs = CertificateDer::pem_file_iter(&ca).map_err(|e| format!("{ca}: {e}"))?;
        for cert in certs {
            let cert = cert.map_err(|e| format!("{ca}: {e}"))?;
            roots.add(cert).map_err(|e| format!("{ca}: {e}"))?;
        }
        // ring: no C toolchain beyond cc, no aws-lc-sys build (docs/decisions/router-crates.md).
        #[allow(deprecated)]
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let name = match self.host.parse::<IpAddr>() {
            Ok(ip) => ServerName::IpAddress(ip.into()),
            Err(_) => ServerName::try_from(self.host.clone()).map_err(|e| format!("API server name: {e}"))?,
        };
        Ok((tokio_rustls::TlsConnector::from(Arc::new(config)), name))
    }

    /// GET `path` on the API server; the answer head (any status) and its body.
    async fn get(&self, path: &str) -> Result<(u16, Incoming), String> {
        let token_path = format!("{}/token", self.token_dir);
        let token = std::fs::read_to_string(&token_path).map_err(|e| format!("{token_path}: {e}"))?;
        let (tls, name) = self.tls()?;
        let tcp = tokio::time::timeout(Duration::from_secs(5), TcpStream::connect((self.host.as_str(), self.port)))
            .await
            .map_err(|_| "connecting to the API server timed out".to_string())?
            .map_err(|e| format!("connecting to the API server: {e}"))?;
        let _ = tcp.set_nodelay(true);
        let stream = tokio::time::timeout(Duration::from_secs(10), tls.connect(name, tcp))
            .await
            .map_err(|_| "TLS handshake with the API server timed out".to_string())?
            .map_err(|e| format!("TLS with the API server: {e}"))?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(|e| e.to_string())?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let host = if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        };
        let req = Request::get(path)
            .header(http::header::HOST, host)
            .header(http::header::AUTHORIZATION, format!("Bearer {}", token.trim()))
            .header(http::header::ACCEPT, "application/json")
            .header(http::header::USER_AGENT, "kimik3-router")
            .body(Empty::<Bytes>::new())
            .map_err(|e| e.to_string())?;
        let resp = tokio::time::timeout(Duration::from_secs(30), sender.send_request(req))
            .await
            .map_err(|_| "the API server did not answer in time".to_string())?
            .map_err(|e| format!("API request: {e}"))?;
        Ok((resp.status().as_u16(), resp.into_body()))
    }
}

struct Tracked {
    uid: String,
    ip: String,
    endpoint: Arc<Endpoint>,
}

pub struct Discovery {
    cfg: Arc<Config>,
    reg: Arc<Registry>,
    api: Api,
    role: Role,
    namespace: String,
    selector: Selector,
    pods: HashMap<String, Tracked>,
}

fn eligible(pod: &Value) -> Option<(String, String, String)> {
    let meta = pod.get("metadata")?;
    let name = meta.get("name")?.as_str()?.to_string();
    let uid = meta.get("uid").and_then(Value::as_str).unwrap_or("").to_string();
    if meta.get("deletionTimestamp").is_some_and(|v| !v.is_null()) {
        return None;
    }
    let status = pod.get("status")?;
    if status.get("phase").and_then(Value::as_str) != Some("Running") {
        return None;
    }
    let ready = status.get("conditions").and_then(Value::as_array).is_some_and(|c| {
        c.iter().any(|c| {
            c.get("type").and_then(Value::as_str) == Some("Ready")
                && c.get("status").and_then(Value::as_str) == Some("True")
        })
    });
    let ip = status.get("podIP").and_then(Value::as_str).filter(|s| !s.is_empty())?;
    ready.then(|| (name, uid, ip.to_string()))
}

fn pod_name(pod: &Value) -> Option<String> {
    pod.get("metadata")?.get("name")?.as_str().map(String::from)
}

impl Discovery {
    pub fn new(
        cfg: Arc<Config>,
        reg: Arc<Registry>,
        role: Role,
        namespace: String,
        selector: Selector,
    ) -> Result<Self, String> {
        let api = Api::from_env(&cfg)?;
        Ok(Self { cfg, reg, api, role, namespace, selector, pods: HashMap::new() })
    }

    fn remove(&mut self, name: &str, why: &str) {
        if let Some(t) = self.pods.remove(name) {
            crate::info!("{} pod {}/{name} ({}) unrouted: {why}", self.role.name(), self.namespace, t.ip);
            self.reg.pool(self.role).remove(&t.endpoint);
            METRICS.inc("kimik3_router_discovery_events_total", &[("event", "pod_removed")]);
        }
    }

    fn apply(&mut self, pod: &Value) {
        let Some(name) = pod_name(pod) else { return };
        let Some((_, uid, ip)) = eligible(pod) else {
            self.remove(&name, "not running, not ready or terminating");
            return;
        };
        if let Some(t) = self.pods.get(&name) {
            if t.uid == uid && t.ip == ip {
                return;
            }
            self.remove(&name, "replaced under the same name");
        }
        let authority = if ip.contains(':') {
            format!("[{ip}]:{}", self.cfg.engine_port)
        } else {
            format!("{ip}:{}", self.cfg.engine_port)
        };
        let endpoint = Endpoint::new(authority, self.role, Some(format!("{}/{name}", self.namespace)));
        crate::info!("{} pod {}/{name} ({ip}) ready: admitting", self.role.name(), self.namespace);
        METRICS.inc("kimik3_router_discovery_events_total", &[("event", "pod_ready")]);
        self.pods.insert(name, Tracked { uid, ip, endpoint: endpoint.clone() });
        tokio::spawn(engines::admit(self.cfg.clone(), self.reg.clone(), endpoint, None, || true));
    }

    fn base(&self) -> String {
        format!("/api/v1/namespaces/{}/pods?labelSelector={}", self.namespace, self.selector.query())
    }

    /// LIST: the pods now and the resourceVersion to watch from.
    async fn relist(&mut self) -> Result<String, String> {
        let (status, body) = self.api.get(&self.base()).await?;
        let bytes = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
        if status != 200 {
            return Err(format!(
                "LIST pods: {status} {}",
                String::from_utf8_lossy(bytes.get(..bytes.len().min(300)).unwrap_or_default())
            ));
        }
        let list: Value = serde_json::from_slice(&bytes).map_err(|e| format!("LIST pods: {e}"))?;
        let rv = list.pointer("/metadata/resourceVersion").and_then(Value::as_str).unwrap_or("").to_string();
        let items = list.get("items").and_then(Value::as_array).cloned().unwrap_or_default();
        let listed: Vec<String> = items.iter().filter_map(pod_name).collect();
        let gone: Vec<String> = self.pods.keys().filter(|k| !listed.contains(k)).cloned().collect();
        for name in gone {
            self.remove(&name, "no longer listed");
        }
        for pod in &items {
            self.apply(pod);
        }
        METRICS.inc("kimik3_router_discovery_events_total", &[("event", "relist")]);
        Ok(rv)
    }

    /// WATCH from `rv` until the server ends it. Ok(Some(rv)): watch again from rv; Ok(None): relist.
    async fn watch(&mut self, rv: &str) -> Result<Option<String>, String> {
        let path = format!(
            "{}&watch=1&allowWatchBookmarks=true&resourceVersion={rv}&timeoutSeconds={WATCH_SECONDS}",
            self.base()
        );
        let (status, mut body) = self.api.get(&path).await?;
        if status == 410 {
            return Ok(None);
        }
        if status != 200 {
            return Err(format!("WATCH pods: {status}"));
        }
        let mut rv = rv.to_string();
        let mut buf: Vec<u8> = Vec::new();
        let idle = Duration::from_secs(WATCH_SECONDS + 30);
        loop {
            let frame = match tokio::time::timeout(idle, body.frame()).await {
                Err(_) => return Err("the watch went silent".into()),
                Ok(None) => return Ok(Some(rv)),
                Ok(Some(Err(e))) => return Err(format!("watch stream: {e}")),
                Ok(Some(Ok(f))) => f,
            };
            let Ok(data) = frame.into_data() else {
                continue;
            };
            buf.extend_from_slice(&data);
            if buf.len() > MAX_LINE {
                return Err("a watch event is too large".into());
            }
            while let Some(nl) = buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = buf.drain(..=nl).collect();
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                let event: Value = serde_json::from_slice(&line).map_err(|e| format!("watch event: {e}"))?;
                let object = event.get("object").cloned().unwrap_or(Value::Null);
                if let Some(v) = object.pointer("/metadata/resourceVersion").and_then(Value::as_str) {
                    rv = v.to_string();
                }
                match event.get("type").and_then(Value::as_str) {
                    Some("ADDED") | Some("MODIFIED") => self.apply(&object),
                    Some("DELETED") => {
                        if let Some(name) = pod_name(&object) {
                            self.remove(&name, "deleted");
                        }
                    }
                    Some("BOOKMARK") => {}
                    Some("ERROR") => {
                        if object.get("code").and_then(Value::as_u64) == Some(410) {
                            return Ok(None);
                        }
                        return Err(format!(
                            "watch error: {}",
                            object.get("message").and_then(Value::as_str).unwrap_or("?")
                        ));
                    }
                    _ => {}
                }
            }
        }
    }

    pub async fn run(mut self) {
        let mut backoff = Duration::from_millis(250);
        let mut rv: Option<String> = None;
        loop {
            let result = match rv.take() {
                None => self.relist().await.map(Some),
                Some(from) => self.watch(&from).await,
            };
            match result {
                Ok(next) => {
                    if next.is_none() {
                        crate::info!("{} watch: resourceVersion expired, relisting", self.role.name());
                    }
                    rv = next;
                    backoff = Duration::from_millis(250);
                }
                Err(e) => {
                    crate::warn!("{} discovery: {e}; again in {:?}", self.role.name(), backoff);
                    METRICS.inc("kimik3_router_discovery_events_total", &[("event", "watch_error")]);
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                    rv = None;
                }
            }
        }
    }
}
