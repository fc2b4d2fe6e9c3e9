//! Listeners: the API port (HTTP/1.1, a bounded number of connections, a header read timeout) and
//! the metrics port; SIGTERM/SIGINT drain: stop accepting, let in-flight requests (streams
//! included) finish up to --drain-secs, then exit.

use crate::metrics::METRICS;
use crate::proxy::App;
use crate::reply;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

const MAX_HEAD_BYTES: usize = 64 * 1024;

async fn terminated() {
    use tokio::signal::unix::{SignalKind, signal};
    match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {},
                _ = int.recv() => {},
            }
        }
        _ => std::future::pending::<()>().await,
    }
}

pub async fn serve_metrics(listener: TcpListener) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        tokio::spawn(async move {
            let svc = service_fn(|req: hyper::Request<hyper::body::Incoming>| async move {
                let resp = if req.method() == hyper::Method::GET && req.uri().path() == "/metrics" {
                    let mut r = hyper::Response::new(reply::full(METRICS.render()));
                    r.headers_mut().insert(
                        http::header::CONTENT_TYPE,
                        http::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
                    );
                    r
                } else {
                    reply::error(404, "not_found", "the metrics port serves GET /metrics only")
                };
                Ok::<_, Infallible>(resp)
            });
            let _ = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(std::time::Duration::from_secs(10))
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

pub async fn serve(app: Arc<App>, listener: TcpListener) {
    let cfg = app.cfg.clone();
    let slots = Arc::new(Semaphore::new(cfg.max_connections));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let stop = terminated();
    tokio::pin!(stop);
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = &mut stop => break,
        };
        let (stream, _) = match accepted {
            Ok(x) => x,
            Err(e) => {
                crate::warn!("accept: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            // Over --max-connections: refuse at once rather than hold memory for it.
            METRICS.inc(
                "kimik3_router_requests_total",
                &[("route", crate::metrics::OTHER_ROUTE), ("outcome", "connection_refused")],
            );
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        let svc = service_fn(move |req| {
            let app = app.clone();
            async move { Ok::<_, Infallible>(app.handle(req).await) }
        });
        let conn = http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(cfg.header_timeout)
            .max_buf_size(MAX_HEAD_BYTES)
            .serve_connection(TokioIo::new(stream), svc);
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            let _ = conn.await;
            drop(slot);
        });
    }
    drop(listener);
    app.draining.store(true, Ordering::Relaxed);
    crate::info!("draining: {} requests in flight, up to {:?}", app.in_flight.load(Ordering::Relaxed), cfg.drain);
    tokio::select! {
        _ = graceful.shutdown() => crate::info!("drained"),
        _ = tokio::time::sleep(cfg.drain) => crate::warn!("drain time up with {} requests in flight", app.in_flight.load(Ordering::Relaxed)),
    }
}
