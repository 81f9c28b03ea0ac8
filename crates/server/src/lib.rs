//! The Spindle state server: accepts connections, runs calls on sharded partitions,
//! parks and wakes waiters, and ends sessions.
//!
//! Layout: [`config`] (settings), `connection` (per-client reader and writer),
//! `shards` (partitions behind mutexes, timers, `keep`), `registry` (reply routing),
//! `sessions` (session lifetimes), `status` (counters and the `status` reply).

pub mod config;
mod connection;
mod registry;
mod sessions;
mod shards;
mod status;

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tracing::{info, warn};

pub use config::Config;

/// The server's version, reported by `hello` and `status`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// State shared by every task of one server.
pub(crate) struct Shared {
    pub(crate) config: Config,
    /// The bound address, as `status` reports it.
    pub(crate) address: String,
    pub(crate) shards: shards::Shards,
    pub(crate) registry: registry::Registry,
    pub(crate) sessions: sessions::Sessions,
    pub(crate) stats: status::Stats,
}

/// A bound server, ready to [`run`](Server::run).
pub struct Server {
    listener: TcpListener,
    shared: Arc<Shared>,
}

impl Server {
    /// Bind the listening socket (`port` 0 picks a free port).
    pub async fn bind(config: Config) -> io::Result<Server> {
        let listener = TcpListener::bind((config.host.as_str(), config.port)).await?;
        let address = listener.local_addr()?.to_string();
        let shared = Arc::new(Shared {
            shards: shards::Shards::new(config.partitions),
            registry: registry::Registry::new(),
            sessions: sessions::Sessions::new(),
            stats: status::Stats::new(),
            address,
            config,
        });
        Ok(Server { listener, shared })
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serve until `shutdown` completes, then stop accepting and return.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> io::Result<()> {
        let shared = self.shared;
        for index in 0..shared.shards.count() {
            tokio::spawn(shards::run_timer(shared.clone(), index));
        }
        tokio::spawn(status::run_sampler(shared.clone()));
        info!(
            address = %shared.address,
            partitions = shared.shards.count(),
            max_frame = shared.config.max_frame,
            session_ttl = ?shared.config.session_ttl,
            "serving"
        );
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                _ = &mut shutdown => break,
                accepted = self.listener.accept() => match accepted {
                    Ok((stream, peer)) => {
                        tokio::spawn(connection::serve(shared.clone(), stream, peer));
                    }
                    Err(e) => {
                        // Usually out of file descriptors: back off instead of spinning,
                        // and keep serving the connections already open.
                        warn!("accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
            }
        }
        info!("stopped accepting connections");
        Ok(())
    }
}
