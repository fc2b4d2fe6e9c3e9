//! kimik3-router: the request router of kimik3-operator (see docs/router.md).
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing))]

mod config;
#[macro_use]
mod log;
mod engines;
mod kube;
mod kv_events;
mod metrics;
mod migrate;
mod msgpack;
mod policy;
mod prompt_ids;
mod proxy;
mod reply;
mod routes;
mod server;
mod trace;
mod upstream;
mod usage;
mod zmtp;

use config::{Engines, Invocation};
use engines::{Endpoint, Registry, Role};
use std::sync::Arc;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let cfg = match config::parse_invocation(&args) {
        Ok(Invocation::Help) => {
            println!("{}", config::USAGE);
            return;
        }
        Ok(Invocation::Check) => return,
        Ok(Invocation::Run(cfg)) => Arc::new(*cfg),
        Err(reason) => {
            eprintln!("kimik3-router: {reason}");
            std::process::exit(2);
        }
    };
    log::init();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("kimik3-router: cannot start the runtime: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = runtime.block_on(run(cfg)) {
        error!("{e}");
        std::process::exit(1);
    }
}

async fn run(cfg: Arc<config::Config>) -> Result<(), String> {
    let reg = Arc::new(Registry::new());
    match &cfg.engines {
        Engines::Static { prefill, decode, workers } => {
            for (role, list) in [(Role::Prefill, prefill), (Role::Decode, decode), (Role::Aggregated, workers)] {
                for e in list {
                    let ep = Endpoint::new(e.authority.clone(), role, None);
                    tokio::spawn(engines::admit(cfg.clone(), reg.clone(), ep, e.rank, || true));
                }
            }
        }
        Engines::Discovery { namespace, prefill, decode, aggregated } => {
            for (role, sel) in [(Role::Prefill, prefill), (Role::Decode, decode), (Role::Aggregated, aggregated)] {
                if let Some(sel) = sel {
                    let d = kube::Discovery::new(cfg.clone(), reg.clone(), role, namespace.clone(), sel.clone())?;
                    tokio::spawn(d.run());
                }
            }
        }
    }
    let api = tokio::net::TcpListener::bind((cfg.host.as_str(), cfg.port))
        .await
        .map_err(|e| format!("cannot listen on {}:{}: {e}", cfg.host, cfg.port))?;
    let metrics = tokio::net::TcpListener::bind((cfg.metrics_host.as_str(), cfg.metrics_port))
        .await
        .map_err(|e| format!("cannot listen on {}:{}: {e}", cfg.metrics_host, cfg.metrics_port))?;
    info!(
        "kimik3-router {} listening on {}:{} (metrics {}:{}), mode {:?}, policies prefill={} decode={} aggregated={}",
        env!("CARGO_PKG_VERSION"),
        cfg.host,
        cfg.port,
        cfg.metrics_host,
        cfg.metrics_port,
        cfg.mode,
        cfg.prefill_policy.name(),
        cfg.decode_policy.name(),
        cfg.policy.name()
    );
    trace::init(cfg.traces.as_ref(), proxy::seed());
    tokio::spawn(server::serve_metrics(metrics));
    let app = proxy::App::new(cfg, reg);
    server::serve(app, api).await;
    Ok(())
}
