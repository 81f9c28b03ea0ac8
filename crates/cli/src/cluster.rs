//! `spindle cluster local|status|add|remove`: run a development cluster on this machine, look
//! at a cluster's shard map, and add or take out a node.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use spindle_core::Value;

use crate::client::{self, field, Client, Failure};

#[derive(Args)]
pub(crate) struct ClusterArgs {
    #[command(subcommand)]
    command: ClusterCommand,
}

#[derive(Subcommand)]
enum ClusterCommand {
    /// Run a cluster of NODES nodes on this machine (ports PORT, PORT+1, ..., a data
    /// directory each under DIR) in the foreground, for development and tests; Ctrl-C stops
    /// it. A node that dies is reported and the others keep serving. Started again with
    /// the same DIR, the nodes recover their state. The nodes split the machine's cores
    /// (`spindle server --threads`, `--shared-cores`).
    Local {
        /// Number of nodes.
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u8).range(1..=9))]
        nodes: u8,
        /// Port of the first node.
        #[arg(long, default_value_t = 7001)]
        port: u16,
        /// Where the nodes' data directories and logs go.
        #[arg(long, default_value = "spindle-cluster")]
        dir: PathBuf,
        /// Replicas of each shard.
        #[arg(long, default_value_t = spindle_server::DEFAULT_REPLICATION_FACTOR as u8,
              value_parser = clap::value_parser!(u8).range(1..=7))]
        replication_factor: u8,
        /// Shards the keys are split into [default: number of cores].
        #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
        partitions: Option<u16>,
    },
    /// Show the cluster's nodes with their liveness (up, suspect, dead; when last heard), and
    /// each shard's voters, learners, leader, progress and health (up, degraded, no quorum).
    Status {
        #[command(flatten)]
        address: crate::AddressArg,
    },
    /// Add node ID, reachable at NODE_ADDRESS, to the cluster while it serves, and wait
    /// until it holds the replicas placed on it. The node is started with `spindle server
    /// --node-id ID --data-dir DIR --join HOST:PORT` (before or after this command; a node
    /// started so adds itself, and this command then only waits for it).
    Add {
        /// The node's id (its `--node-id`).
        node: u64,
        /// Where the other nodes and clients reach it (its `--advertise`, or HOST:PORT).
        node_address: String,
        #[command(flatten)]
        address: crate::AddressArg,
    },
    /// Remove node ID from the cluster while it serves: its replicas move to other nodes
    /// first (and leadership away from it); then it may be stopped.
    Remove {
        /// The node's id (`--node-id` it was started with).
        node: u64,
        #[command(flatten)]
        address: crate::AddressArg,
    },
}

pub(crate) fn run(args: ClusterArgs) -> Result<(), String> {
    if let ClusterCommand::Status { address }
    | ClusterCommand::Add { address, .. }
    | ClusterCommand::Remove { address, .. } = &args.command
    {
        client::use_tls(&address.tls);
    }
    match args.command {
        ClusterCommand::Local {
            nodes,
            port,
            dir,
            replication_factor,
            partitions,
        } => local(nodes, port, &dir, replication_factor, partitions),
        ClusterCommand::Status { address } => status(&address.address),
        ClusterCommand::Add {
            node,
            node_address,
            address,
        } => add(&address.address, node, &node_address),
        ClusterCommand::Remove { node, address } => remove(&address.address, node),
    }
}

fn ids(value: Option<&Value>) -> Vec<u64> {
    value
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default()
}

fn cluster_map(address: &str) -> Result<Value, String> {
    Client::connect(address)?.cluster()
}

/// The cluster as the nodes that answer see it: each group as its leader sees it (a node
/// knows only the groups it holds), and the nodes' liveness as the metadata group's leader
/// (the one that judges it) sees it.
struct Views {
    groups: Vec<Value>,
    metadata: Value,
    /// Node id -> `{state, last_heard_ms}`.
    liveness: Value,
}

fn leaders_views(map: &Value) -> Views {
    let mut groups = client::groups(map);
    groups.push(field(map, "metadata").cloned().unwrap_or(Value::Nil));
    let nodes = field(map, "nodes").and_then(Value::as_map).cloned().unwrap_or_default();
    let views: Vec<Value> = nodes
        .iter()
        .filter_map(|(_, a)| cluster_map(a.as_str()?).ok())
        .collect();
    // A group no answering node leads is shown as a member of it sees it, the most recent.
    let claims = |view: &Value, g: &Value, voter: bool| {
        let node = field(view, "node").and_then(Value::as_u64);
        node.is_some()
            && match voter {
                true => ids(field(g, "voters")).contains(&node.unwrap_or(0)),
                false => field(g, "leader").and_then(Value::as_u64) == node,
            }
    };
    let progress = |g: &Value| {
        let num = |name: &str| field(g, name).and_then(Value::as_u64).unwrap_or(0);
        (num("term"), num("applied"))
    };
    // How each group's view was chosen: 0 the asked node's, 1 a voter's, 2 its leader's.
    let mut chosen = vec![0; groups.len()];
    let mut liveness = field(map, "liveness").cloned().unwrap_or(Value::Nil);
    for view in &views {
        let mut theirs = client::groups(view);
        let metadata = field(view, "metadata").cloned().unwrap_or(Value::Nil);
        if claims(view, &metadata, false) {
            liveness = field(view, "liveness").cloned().unwrap_or(Value::Nil);
        }
        theirs.push(metadata);
        for ((mine, chosen), their) in groups.iter_mut().zip(chosen.iter_mut()).zip(theirs) {
            let rank = match (claims(view, &their, false), claims(view, &their, true)) {
                (true, _) => 2,
                (false, true) => 1,
                _ => continue,
            };
            if rank > *chosen || (rank == 1 && *chosen == 1 && progress(&their) > progress(mine)) {
                (*mine, *chosen) = (their, rank);
            }
        }
    }
    let metadata = groups.pop().unwrap_or(Value::Nil);
    Views {
        groups,
        metadata,
        liveness,
    }
}

/// A node's liveness (`up`, `suspect`, `dead`) and how long ago it was last heard.
fn liveness_of(liveness: &Value, node: u64) -> (String, Option<u64>) {
    let entry = liveness
        .as_map()
        .and_then(|m| m.iter().find(|(id, _)| id.as_u64() == Some(node)))
        .map(|(_, e)| e);
    let state = entry.and_then(|e| field(e, "state")).and_then(Value::as_str);
    let heard = entry.and_then(|e| field(e, "last_heard_ms")).and_then(Value::as_u64);
    (state.unwrap_or("up").to_string(), heard)
}

/// A group's health from a quorum's view: `no quorum` when its live voters are no majority,
/// `no leader` while it elects one, `degraded` when a voter is suspect or dead, else `up`;
/// `, moving` while its voters are not its placement.
fn health(g: &Value, liveness: &Value) -> String {
    let voters = ids(field(g, "voters"));
    let up = |n: u64| liveness_of(liveness, n).0 == "up";
    let live = voters.iter().filter(|&&n| up(n)).count();
    let leader = field(g, "leader").and_then(Value::as_u64).unwrap_or(0);
    let state = if live <= voters.len() / 2 {
        "no quorum"
    } else if leader == 0 || !up(leader) || !voters.contains(&leader) {
        "no leader"
    } else if live < voters.len() {
        "degraded"
    } else {
        "up"
    };
    let (mut settled, mut placed) = (voters.clone(), ids(field(g, "placement")));
    settled.sort_unstable();
    placed.sort_unstable();
    match settled == placed || state == "no quorum" {
        true => state.to_string(),
        false => format!("{state}, moving"),
    }
}

fn status(address: &str) -> Result<(), String> {
    let map = cluster_map(address)?;
    let nodes = field(&map, "nodes")
        .and_then(Value::as_map)
        .cloned()
        .unwrap_or_default();
    let Views {
        groups,
        metadata,
        liveness,
    } = leaders_views(&map);
    println!(
        "{} nodes, {} shards, {} replicas each, cluster format {}",
        nodes.len(),
        groups.len(),
        field(&map, "replication_factor").and_then(Value::as_u64).unwrap_or(0),
        // A node of the first release tells none: it writes format 1.
        field(&map, "cluster_format").and_then(Value::as_u64).unwrap_or(1)
    );
    println!();
    println!(
        "{:<6} {:<24} {:>8}  {:<9} {:>10}",
        "node", "address", "leading", "liveness", "last heard"
    );
    for (id, addr) in &nodes {
        let id = id.as_u64().unwrap_or(0);
        let leading = groups
            .iter()
            .filter(|g| field(g, "leader").and_then(Value::as_u64) == Some(id))
            .count();
        let (state, heard) = liveness_of(&liveness, id);
        let heard = heard.map_or("-".to_string(), |ms| format!("{:.1} s ago", ms as f64 / 1e3));
        println!(
            "{id:<6} {:<24} {leading:>8}  {state:<9} {heard:>10}",
            addr.as_str().unwrap_or("?")
        );
    }
    println!();
    println!(
        "{:<6} {:<8} {:<12} {:<10} {:<12} {:>6} {:>10} {:>10}  health",
        "shard", "leader", "voters", "learners", "placement", "term", "commit", "applied"
    );
    for g in groups.iter().chain(std::iter::once(&metadata)) {
        let num = |name: &str| field(g, name).and_then(Value::as_u64).unwrap_or(0);
        let list = |name: &str| {
            let v = ids(field(g, name));
            if v.is_empty() {
                "-".to_string()
            } else {
                v.iter().map(u64::to_string).collect::<Vec<_>>().join(",")
            }
        };
        let name = match std::ptr::eq(g, &metadata) {
            true => "meta".to_string(),
            false => num("shard").to_string(),
        };
        let leader = match num("leader") {
            0 => "-".to_string(),
            n => n.to_string(),
        };
        println!(
            "{:<6} {:<8} {:<12} {:<10} {:<12} {:>6} {:>10} {:>10}  {}",
            name,
            leader,
            list("voters"),
            list("learners"),
            list("placement"),
            num("term"),
            num("commit"),
            num("applied"),
            health(g, &liveness)
        );
    }
    Ok(())
}

fn add(address: &str, node: u64, node_address: &str) -> Result<(), String> {
    if node == 0 {
        return Err("node ids start at 1".into());
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut announced = false;
    loop {
        let map = cluster_map(address)?;
        let listed = field(&map, "nodes")
            .and_then(Value::as_map)
            .and_then(|nodes| nodes.iter().find(|(id, _)| id.as_u64() == Some(node)))
            .map(|(_, a)| a.as_str().unwrap_or_default().to_string());
        let Views { groups, metadata, .. } = leaders_views(&map);
        match listed {
            Some(at) if at != node_address => {
                return Err(format!("node {node} is a member at {at}; remove it first"));
            }
            Some(_) => {
                // Every shard placed on it has it as a voter, and it follows the metadata.
                let holds = |g: &Value, voter: bool| {
                    ids(field(g, "voters")).contains(&node) || (!voter && ids(field(g, "learners")).contains(&node))
                };
                let placed: Vec<&Value> = groups
                    .iter()
                    .filter(|g| ids(field(g, "placement")).contains(&node))
                    .collect();
                let pending = placed.iter().filter(|g| !holds(g, true)).count() + usize::from(!holds(&metadata, false));
                if pending == 0 {
                    println!("node {node} is a member and holds its {} replicas", placed.len());
                    return Ok(());
                }
                if !announced {
                    println!("node {node} is a member; waiting for it to take its replicas ({pending} to go)");
                    announced = true;
                }
            }
            None => {
                // The metadata group's leader takes the request; retried until it is recorded.
                if let Some(leader) = field(&metadata, "leader_address").and_then(Value::as_str) {
                    if let Ok(mut client) = Client::connect(leader) {
                        // A refusal is final (an id or address taken); anything else is retried.
                        if let Err(Failure::Remote(r)) = client.join(node, node_address) {
                            if r.kind == "ValueError" || r.kind == "Unauthorized" {
                                return Err(format!("the cluster refused node {node}: {}", r.message));
                            }
                        }
                    }
                }
            }
        }
        if Instant::now() > deadline {
            return Err(format!(
                "node {node} has not taken its replicas after 120 s: is it running? (spindle server --node-id \
                 {node} --data-dir DIR --join {address}; `spindle cluster remove {node}` undoes the registration)"
            ));
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

fn remove(address: &str, node: u64) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut asked = false;
    loop {
        let map = cluster_map(address)?;
        let Views {
            mut groups, metadata, ..
        } = leaders_views(&map);
        let is_member =
            |g: &Value| ids(field(g, "voters")).contains(&node) || ids(field(g, "learners")).contains(&node);
        let listed = field(&map, "nodes")
            .and_then(Value::as_map)
            .is_some_and(|nodes| nodes.iter().any(|(id, _)| id.as_u64() == Some(node)));
        if !asked && !listed {
            return Err(format!("node {node} is not a member of the cluster"));
        }
        groups.push(metadata.clone());
        let member = groups.iter().filter(|g| is_member(g)).count();
        if !listed && member == 0 {
            println!("node {node} left the cluster: it holds no replica any more and can be stopped");
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("node {node} still holds {member} replicas after 120 s"));
        }
        if listed {
            // The metadata group's leader takes the request; retried until it is recorded.
            if let Some(leader) = field(&metadata, "leader_address").and_then(Value::as_str) {
                if let Ok(mut client) = Client::connect(leader) {
                    asked |= client.leave(node).is_ok();
                }
            }
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// Start one node of a local cluster and wait for its listening line. Its stdin stays a pipe
/// held by this process (`--embedded`): the node stops when this process ends, however.
fn start_node(
    dir: &Path,
    id: u64,
    port: u16,
    join: Option<&str>,
    key: &str,
    extra: &[String],
) -> Result<Child, String> {
    let data_dir = dir.join(format!("node{id}"));
    let log_path = dir.join(format!("node{id}.log"));
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(|e| format!("cannot open {}: {e}", log_path.display()))?;
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the spindle binary: {e}"))?;
    let mut command = Command::new(exe);
    command
        .args([
            "server",
            "--embedded",
            "--node-id",
            &id.to_string(),
            "--port",
            &port.to_string(),
        ])
        .arg("--data-dir")
        .arg(&data_dir)
        .args(extra)
        .env("SPINDLE_CLUSTER_KEY", key)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(log);
    // A restarted member finds its cluster in its data directory; only a new node joins.
    if let Some(join) = join.filter(|_| !data_dir.join("raft").exists()) {
        command.args(["--join", join]);
    }
    let mut child = command.spawn().map_err(|e| format!("cannot start node {id}: {e}"))?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).map_err(|e| e.to_string())?;
    if !line.starts_with("spindle listening on ") {
        let _ = child.kill();
        let _ = child.wait();
        return Err(format!("node {id} did not start; see {}", log_path.display()));
    }
    Ok(child)
}

fn local(nodes: u8, port: u16, dir: &Path, rf: u8, partitions: Option<u16>) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    // Nodes sharing the cores: more threads than cores would only switch among themselves.
    let threads = (spindle_server::config::cores() / usize::from(nodes)).max(1);
    let mut extra = vec![
        "--replication-factor".to_string(),
        rf.to_string(),
        "--threads".to_string(),
        threads.to_string(),
        "--shared-cores".to_string(),
    ];
    if let Some(p) = partitions {
        extra.extend(["--partitions".to_string(), p.to_string()]);
    }
    // The nodes authenticate each other with a key of their own, kept beside their data so
    // that a restarted cluster (and a node started by hand to join it) finds it there.
    let key = cluster_key(dir)?;
    let addresses: Vec<String> = (0..u16::from(nodes))
        .map(|i| format!("127.0.0.1:{}", port + i))
        .collect();
    let mut children: Vec<Child> = Vec::new();
    for i in 0..addresses.len() {
        let join = (i > 0).then(|| addresses[0].as_str());
        // On an error the nodes started so far stop with this process.
        children.push(start_node(dir, i as u64 + 1, port + i as u16, join, &key, &extra)?);
    }
    // Ready once every group has a leader.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ready = cluster_map(&addresses[0]).ok().is_some_and(|map| {
            let Views { groups, metadata, .. } = leaders_views(&map);
            let nodes_listed = field(&map, "nodes").and_then(Value::as_map).map_or(0, Vec::len);
            nodes_listed == addresses.len()
                && groups
                    .iter()
                    .chain(std::iter::once(&metadata))
                    .all(|g| field(g, "leader").and_then(Value::as_u64).unwrap_or(0) != 0)
        });
        if ready {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!(
                "the cluster did not come up within 60 s; see the logs in {}",
                dir.display()
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    for (i, address) in addresses.iter().enumerate() {
        let id = i + 1;
        println!(
            "node {id}  {address}  data {}  log {}",
            dir.join(format!("node{id}")).display(),
            dir.join(format!("node{id}.log")).display()
        );
    }
    println!("export SPINDLE_ADDRESS={}", addresses.join(","));
    println!("the cluster is up; Ctrl-C stops it");
    let stop = stop_requested();
    // A node that dies (killed to try a failover, say) is reported; the others go on.
    let mut running: Vec<(usize, Child)> = children.into_iter().enumerate().collect();
    while !running.is_empty() {
        if stop.load(std::sync::atomic::Ordering::Relaxed) {
            // Each node stops when its stdin closes; wait, so that their data directories
            // are free when this command returns.
            for (_, child) in &mut running {
                drop(child.stdin.take());
            }
            for (_, child) in &mut running {
                let _ = child.wait();
            }
            return Ok(());
        }
        running.retain_mut(|(i, child)| match child.try_wait() {
            Ok(Some(status)) => {
                let log = dir.join(format!("node{}.log", *i + 1));
                eprintln!("spindle: node {} exited ({status}); see {}", *i + 1, log.display());
                false
            }
            _ => true,
        });
        std::thread::sleep(Duration::from_millis(100));
    }
    Err("every node exited".into())
}

/// `$SPINDLE_CLUSTER_KEY`, else the key in `DIR/cluster-key` (made on the first run, readable
/// by this user only).
fn cluster_key(dir: &Path) -> Result<String, String> {
    if let Some(key) = std::env::var("SPINDLE_CLUSTER_KEY").ok().filter(|k| !k.is_empty()) {
        return Ok(key);
    }
    let path = dir.join("cluster-key");
    if let Ok(key) = std::fs::read_to_string(&path) {
        return Ok(key.trim().to_string());
    }
    let key = client::new_token()?;
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .and_then(|mut f| f.write_all(key.as_bytes()))
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Ok(key)
}

/// A flag set on SIGINT or SIGTERM.
fn stop_requested() -> std::sync::Arc<std::sync::atomic::AtomicBool> {
    let flag = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let set = flag.clone();
    std::thread::spawn(move || {
        let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
            return;
        };
        runtime.block_on(async {
            use tokio::signal::unix::{signal, SignalKind};
            let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
                return;
            };
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            set.store(true, std::sync::atomic::Ordering::Relaxed);
        });
    });
    flag
}
