//! The Spindle state server: accepts connections, runs calls on sharded partitions,
//! parks and wakes waiters, and ends sessions.
//!
//! Layout, top-down (a module uses only those below it; the root wires them together):
//! - front ends: `connection` (per-client reader and writer: the native protocol), `http`
//!   (the HTTP front end), `status` (counters and the `status` reply);
//! - what both front ends run: `nested` (compiled methods' calls to other objects, driven
//!   as transactions) over `calls` (a caller's operation on its shard, without a
//!   transport) and `transactions` (multi-shard commits), `sessions` (session lifetimes),
//!   `gateway` (functions: the worker pool and invocations);
//! - `shards` (partitions behind mutexes, timers, `keep`) with their durability, `journal`
//!   over `wal` (the write-ahead log), and their replication, `cluster` (cluster mode: every
//!   shard a Raft group, see docs/cluster.md);
//! - `hosts` (user-defined objects: their classes and the host processes that run them),
//!   `process` and `cgroup` (starting, supervising and containing Python child processes);
//! - beside them: [`config`] (settings), `access` and `acl` (credentials, users, roles and
//!   permissions: a pure state machine), `pickles` (stamping pickles with their writer),
//!   `registry` (reply routing), `audit` (refusals and protocol faults, logged without
//!   flooding), `tls`, `upgrade` (data directories of earlier releases).

mod access;
mod acl;
mod audit;
mod calls;
mod cgroup;
mod cluster;
pub mod config;
mod connection;
mod gateway;
mod hosts;
mod http;
mod journal;
mod nested;
mod pickles;
mod process;
mod registry;
mod sessions;
mod shards;
mod status;
pub mod tls;
mod transactions;
mod upgrade;
mod wal;

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tracing::info;

pub use cluster::{ClusterConfig, DEFAULT_DEAD_AFTER, DEFAULT_REPLICATION_FACTOR};
pub use config::Config;
pub use journal::RecoveryError;

/// The shard of `key` among `shards` (as every node computes it; clients route by it).
pub fn shard_of(key: &str, shards: usize) -> usize {
    (shards::hash(key) % shards.max(1) as u64) as usize
}

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
    /// [`sessions::recovered`], for the shards' op logs and Raft groups below the sessions'
    /// layer: the sessions found in a recovered log, or a log this node just took the lead of.
    pub(crate) adopt_sessions: fn(&Arc<Shared>, Vec<Arc<str>>),
    pub(crate) stats: status::Stats,
    pub(crate) transactions: transactions::Transactions,
    /// The drivers of compiled methods' nested calls.
    pub(crate) nested: nested::Drivers,
    /// Refused requests, protocol faults and failed calls, logged once a minute per client.
    pub(crate) audit: Arc<audit::Audit>,
    /// Credentials, users and roles.
    pub(crate) access: Arc<access::Access>,
    pub(crate) gateway: gateway::Gateway,
    pub(crate) hosts: hosts::Hosts,
    /// TLS on the listening port and toward peers (`--tls-cert`).
    pub(crate) tls: Option<tls::Tls>,
    /// This node's part in a cluster (`--node-id`).
    pub(crate) cluster: Option<cluster::Cluster>,
    /// Where workers connect (the bound address, loopback when bound to every interface).
    pub(crate) worker_address: String,
    /// The cgroups workers and hosts run in, if any (removed when the server ends).
    pub(crate) containment: cgroup::Containment,
    /// This server's claim on its data directory, held for its life.
    _data_lock: Option<spindle_storage::DirLock>,
}

/// A bound server, ready to [`run`](Server::run).
pub struct Server {
    listener: TcpListener,
    /// The HTTP front end's port (`--http-port`).
    http_listener: Option<TcpListener>,
    shared: Arc<Shared>,
}

impl Server {
    /// Bind the listening socket (`port` 0 picks a free port), then recover persistent
    /// objects (with a data directory) before anything is served: connections made meanwhile
    /// wait in the listen backlog. A failed recovery is an error carrying a [`RecoveryError`].
    pub async fn bind(mut config: Config) -> io::Result<Server> {
        if config.cluster.is_some() && config.data_dir.is_none() {
            return Err(io::Error::other(
                "a cluster node needs --data-dir (its replicas' Raft logs live there)",
            ));
        }
        let tls = config.tls.as_ref().map(tls::Tls::load).transpose()?;
        let data_lock = match &config.data_dir {
            Some(dir) => {
                let lock = spindle_storage::lock_dir(dir)?;
                if let Some(shards) = cluster_shards(&config, dir, tls.as_ref()).await? {
                    config.partitions = shards;
                }
                config.partitions = journal::partitions(dir, config.partitions)?;
                Some(lock)
            }
            None => None,
        };
        let listener = TcpListener::bind((config.host.as_str(), config.port)).await?;
        let http_listener = match config.http_port {
            Some(port) => Some(http::bind(&config.host, port).await?),
            None => None,
        };
        let local = listener.local_addr()?;
        let address = local.to_string();
        let mut reachable = local;
        if local.ip().is_unspecified() {
            let loopback: std::net::IpAddr = match local {
                SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
            };
            reachable.set_ip(loopback);
        }
        // A cluster keeps its users and roles in its metadata group, a single server in its
        // data directory.
        let acl_dir = config.data_dir.as_deref().filter(|_| config.cluster.is_none());
        let access = Arc::new(access::Access::open(
            config.functions.token.as_deref(),
            config.cluster_key(),
            acl_dir,
        )?);
        let (cluster, replicas, drivers) = match (&config.cluster, &config.data_dir) {
            (Some(settings), Some(dir)) => {
                let advertised = settings.advertise.clone().unwrap_or_else(|| reachable.to_string());
                let p = cluster::prepare(
                    settings,
                    dir,
                    advertised,
                    config.partitions,
                    config.fsync,
                    config.snapshot_after,
                    access.clone(),
                )?;
                (Some(p.cluster), p.replicas, p.drivers)
            }
            _ => (None, Vec::new(), Vec::new()),
        };
        let audit = Arc::new(audit::Audit::default());
        let library: Arc<dyn spindle_core::objects::compiled::Library> =
            Arc::new(spindle_wasm::Runtime::new(config.wasm).map_err(io::Error::other)?);
        let shared = Arc::new(Shared {
            access,
            cluster,
            tls,
            shards: shards::Shards::new(
                config.partitions,
                config.limits.reply_log_limits(config.partitions),
                spindle_core::partition::Memory::new(config.limits.max_memory),
                library,
            ),
            registry: registry::Registry::new(audit.clone()),
            sessions: sessions::Sessions::new(),
            adopt_sessions: sessions::recovered,
            stats: status::Stats::new(),
            transactions: transactions::Transactions::default(),
            nested: nested::Drivers::default(),
            audit,
            gateway: gateway::Gateway::new(config.functions.clone()),
            hosts: hosts::Hosts::new(&config),
            worker_address: reachable.to_string(),
            containment: cgroup::Containment::detect(config.functions.cgroups, config.functions.pids_limit),
            address,
            config,
            _data_lock: data_lock,
        });
        if let Some(cluster) = &shared.cluster {
            // Connection ids appear in replicated records: each node numbers its own.
            shared.registry.start_after(cluster.node_id << 40);
            for (index, replica) in replicas.into_iter().enumerate() {
                shared
                    .shards
                    .with(index, |s| {
                        s.partition.enable_storage();
                        s.replica = Some(replica);
                    })
                    .map_err(io::Error::other)?;
            }
            cluster::start(&shared, drivers);
        } else if let Some(dir) = &shared.config.data_dir {
            journal::start(&shared, dir, shared.config.fsync, shared.config.snapshot_after)?;
        }
        Ok(Server {
            listener,
            http_listener,
            shared,
        })
    }

    /// This node's id in its cluster (`None` for a single server).
    pub fn node_id(&self) -> Option<u64> {
        self.shared.cluster.as_ref().map(|c| c.node_id)
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The HTTP front end's address, if it has one (`--http-port`).
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http_listener.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// Serve until `shutdown` completes, then stop accepting and return.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> io::Result<()> {
        let shared = self.shared;
        for index in 0..shared.shards.count() {
            tokio::spawn(shards::run_timer(shared.clone(), index));
        }
        tokio::spawn(status::run_sampler(shared.clone()));
        tokio::spawn(gateway::run_timer(shared.clone()));
        tokio::spawn(hosts::run_timer(shared.clone()));
        // Stops accepting with the native port (its requests in progress end with the process).
        let http = self.http_listener.map(|l| tokio::spawn(http::run(shared.clone(), l)));
        let functions = &shared.config.functions;
        info!(
            address = %shared.address,
            partitions = shared.shards.count(),
            max_frame = shared.config.max_frame,
            session_ttl = ?shared.config.session_ttl,
            max_workers = functions.max_workers,
            object_hosts = shared.config.hosts.count,
            object_call_timeout = ?shared.config.hosts.call_timeout,
            python = %functions.python.display(),
            token = functions.token.is_some(),
            tls = shared.tls.is_some(),
            "serving"
        );
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                _ = &mut shutdown => break,
                accepted = self.listener.accept() => match accepted {
                    Ok((stream, peer)) => {
                        // Counted here, in the order accepted (a TLS handshake in progress
                        // included: connections that never finish one would otherwise hold
                        // descriptors and handshake state past the limit).
                        let open = shared.stats.connections.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                        tokio::spawn(connection::serve(shared.clone(), stream, peer, open));
                    }
                    Err(e) => {
                        // Usually out of file descriptors: back off instead of spinning,
                        // and keep serving the connections already open.
                        shared.audit.accept_failed(&e);
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
            }
        }
        if let Some(http) = http {
            http.abort();
        }
        info!("stopped accepting connections");
        hosts::stopping(&shared);
        shared.audit.flush();
        // The server's cgroups go with it (`Shared` may outlive this: tasks hold it).
        for _ in 0..100 {
            if shared.containment.remove_all() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(())
    }
}

/// A new node joining a cluster takes the cluster's shard count from the node it joins
/// through (every node splits the keys the same way). `None`: keep the configured count.
async fn cluster_shards(config: &Config, dir: &std::path::Path, tls: Option<&tls::Tls>) -> io::Result<Option<usize>> {
    let Some(seed) = config.cluster.as_ref().and_then(|c| c.join.as_deref()) else {
        return Ok(None);
    };
    if dir.join("raft").exists() {
        return Ok(None); // A member already: its logs say which shards it has.
    }
    let key = config.cluster_key().unwrap_or_default();
    let map = cluster::peers_request(seed, key, tls, vec!["cluster".into()])
        .await
        .map_err(|e| io::Error::other(format!("cannot join through {seed}: {}", e.message)))?;
    let shards = match &map {
        spindle_core::Value::Map(entries) => entries
            .iter()
            .find(|(k, _)| k.as_str() == Some("shards"))
            .and_then(|(_, v)| v.as_u64()),
        _ => None,
    };
    match shards {
        Some(n) if n > 0 => Ok(Some(n as usize)),
        _ => Err(io::Error::other(format!(
            "cannot join through {seed}: its cluster map has no shard count"
        ))),
    }
}
