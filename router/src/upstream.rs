//! Requests to engines: one fresh HTTP/1.1 connection per leg, so that a failure can be classified by
//! what the engine may have received. A refused or timed-out TCP connect wrote no byte: the engine
//! provably never took the request (the only case in which a decode may get the same
//! kv_transfer_params again). Anything after the connect may have reached it.

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use std::time::Duration;
use tokio::net::TcpStream;

#[derive(Debug)]
pub enum SendError {
    /// The connect was refused or timed out: no byte of the request was written.
    Connect(String),
    /// The connection was up: the engine may have received (part of) the request.
    Failed(String),
}

impl SendError {
    pub fn message(&self) -> &str {
        match self {
            Self::Connect(m) | Self::Failed(m) => m,
        }
    }
}

pub async fn connect(authority: &str, timeout: Duration) -> Result<TcpStream, SendError> {
    match tokio::time::timeout(timeout, TcpStream::connect(authority)).await {
        Err(_) => Err(SendError::Connect(format!("connect to {authority} timed out"))),
        Ok(Err(e)) => Err(SendError::Connect(format!("connect to {authority}: {e}"))),
        Ok(Ok(s)) => {
            let _ = s.set_nodelay(true);
            Ok(s)
        }
    }
}

/// Send `req` over a fresh connection that is already up.
pub async fn send_on(stream: TcpStream, req: Request<Full<Bytes>>) -> Result<Response<Incoming>, SendError> {
    let (mut sender, conn) = hyper::client::conn::http1::Builder::new()
        .handshake(TokioIo::new(stream))
        .await
        .map_err(|e| SendError::Failed(format!("handshake: {e}")))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    sender.send_request(req).await.map_err(|e| SendError::Failed(format!("request: {e}")))
}

pub async fn send(
    authority: &str,
    req: Request<Full<Bytes>>,
    connect_timeout: Duration,
) -> Result<Response<Incoming>, SendError> {
    let stream = connect(authority, connect_timeout).await?;
    send_on(stream, req).await
}

/// Read a whole answer body, at most `cap` bytes.
pub async fn read_body(body: Incoming, cap: usize) -> Result<Bytes, String> {
    Limited::new(body, cap).collect().await.map(|c| c.to_bytes()).map_err(|e| format!("reading the answer: {e}"))
}

/// GET `path` on an engine, whole body, within `timeout` (health probes, /metrics).
pub async fn get(authority: &str, path: &str, timeout: Duration) -> Result<(u16, Bytes), String> {
    let work = async {
        let req = Request::get(path)
            .header(hyper::header::HOST, authority)
            .body(Full::new(Bytes::new()))
            .map_err(|e| e.to_string())?;
        let resp = send(authority, req, timeout).await.map_err(|e| e.message().to_string())?;
        let status = resp.status().as_u16();
        let body = read_body(resp.into_body(), 16 << 20).await?;
        Ok((status, body))
    };
    match tokio::time::timeout(timeout, work).await {
        Ok(r) => r,
        Err(_) => Err(format!("GET {path} on {authority} timed out")),
    }
}
