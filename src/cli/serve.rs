//! `canopy serve`: logging, the server's start, and a graceful stop on a signal.
//!
//! Must never: configure anything itself; what the server runs with is `Config`'s.

use anyhow::Result;
use canopy::config::Config;
use canopy::server::Server;
use tokio_util::sync::CancellationToken;

use crate::ServeArgs;

pub(crate) fn init_logging(filter: Option<&str>) {
    use tracing_subscriber::EnvFilter;
    let filter = match filter {
        Some(f) => EnvFilter::new(f),
        None => EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();
}

pub(crate) async fn serve(args: ServeArgs) -> Result<()> {
    init_logging(args.log.as_deref());
    let mut config = Config::load(args.config.as_deref(), std::env::vars())?;
    if let Some(listen) = args.listen {
        config.native.listen = listen;
    }
    if let Some(listen) = args.mqtt_listen {
        config.mqtt.listen = Some(listen);
    }
    if let Some(listen) = args.http_listen {
        config.http.listen = Some(listen);
    }
    if args.allow_anonymous {
        config.server.allow_anonymous = true;
    }
    config.validate()?;
    let server = Server::bind(config).await?;
    let shutdown = CancellationToken::new();
    let signals = shutdown.clone();
    tokio::spawn(async move {
        match wait_for_signal().await {
            Ok(name) => tracing::info!(signal = name, "shutting down: draining connections"),
            Err(error) => tracing::error!(%error, "cannot listen for signals"),
        }
        signals.cancel();
    });
    server.run(shutdown).await;
    Ok(())
}

#[cfg(unix)]
pub(crate) async fn wait_for_signal() -> std::io::Result<&'static str> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    Ok(tokio::select! {
        _ = interrupt.recv() => "SIGINT",
        _ = terminate.recv() => "SIGTERM",
    })
}

#[cfg(not(unix))]
pub(crate) async fn wait_for_signal() -> std::io::Result<&'static str> {
    tokio::signal::ctrl_c().await?;
    Ok("ctrl-c")
}
