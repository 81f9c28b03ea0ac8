//! The calls of every front end, without a transport: given the server's shared state, a
//! caller (its session, connection and thread) and an [`Op`], run it on its shard — admission,
//! exactly-once, persistence, replication, forwarding to object hosts — and hand back the
//! replies it produced. The native protocol (`connection.rs`) and HTTP (`http/`) both call
//! these, so each rule is written once.
//!
//! A reply is addressed to a [`Token`] (connection, request): the caller's own reply is
//! usually among the returned deliveries, but a call that parks (a queue's `get`, a barrier's
//! `wait`) is answered later through the registry, like any waiter woken by another call.
//! Front ends route deliveries their own way (a connection batches its own replies; HTTP
//! hands them all to the registry, whose mailbox wakes the waiting request).

use std::sync::Arc;
use std::time::Instant;

use spindle_core::objects::{compiled, user};
use spindle_core::partition::{Op, UNNAMED_PREFIX};
use spindle_core::{Caller, Delivery, Error, ErrorKind, Token, Value};
use tracing::warn;

use crate::access::Grant;
use crate::acl::{Permission, Principal};
use crate::hosts;
use crate::Shared;

/// What a call produced: replies to route now, and work for object hosts, to start once the
/// replies are on their way (so a host's answer never overtakes them).
pub(crate) struct Applied {
    pub(crate) deliveries: Vec<Delivery>,
    pub(crate) host_actions: Vec<hosts::Action>,
}

/// Run an object operation on its shard (`seq` and `acked`: see `Partition::apply`) as far
/// as `grant` allows: a `create` its caller may make only to attach to an object that exists
/// (`Grant::IfExists`, checked under the shard's lock), a call that may only read
/// (`Grant::IfReads`: `Partition::apply_reading`). A `create` of a
/// user-defined or compiled type runs the class's or the module's code, which must be
/// defined at the version it names.
pub(crate) fn apply(
    shared: &Shared,
    caller: &Caller,
    token: Token,
    (seq, acked): (u64, u64),
    op: Op,
    grant: Grant,
) -> Result<Applied, Error> {
    let Op::Create { type_name, args, .. } = &op else {
        return apply_with_code(shared, caller, token, (seq, acked), op, grant, None);
    };
    if !user::is_user_type(type_name) && !compiled::is_compiled_type(type_name) {
        return apply_with_code(shared, caller, token, (seq, acked), op, grant, None);
    }
    // Held across the apply, so a concurrent `define` cannot swap the version under it.
    let classes = shared.hosts.classes();
    let code = match args.first().and_then(Value::as_str) {
        Some(version) => Some(hosts::class_code(&classes, type_name, version)?),
        // A malformed create: the partition says what is wrong with it.
        None => None,
    };
    apply_with_code(shared, caller, token, (seq, acked), op, grant, code.as_ref())
}

/// Before a transaction's create of a compiled type: its module, compiled in the partition
/// of the key (as [`apply`] does for a create outside transactions).
pub(crate) fn offer_module(shared: &Shared, op: &Op) -> Result<(), Error> {
    let Op::Create { type_name, args, .. } = op else {
        return Ok(());
    };
    let Some(version) = args.first().and_then(Value::as_str) else {
        return Ok(());
    };
    if !compiled::is_compiled_type(type_name) {
        return Ok(());
    }
    let code = hosts::class_code(&shared.hosts.classes(), type_name, version)?;
    let index = shared.shards.index_of(op.key());
    shared
        .shards
        .with(index, |s| s.partition.offer_class(type_name, version, &code))?
}

fn apply_with_code(
    shared: &Shared,
    caller: &Caller,
    token: Token,
    (seq, acked): (u64, u64),
    op: Op,
    grant: Grant,
    code: Option<&Arc<Vec<u8>>>,
) -> Result<Applied, Error> {
    let index = shared.shards.index_of(op.key());
    // Over --max-memory, caches give room before anything is refused (as Redis evicts
    // before each command); under it, this is one load of a shared count.
    let memory = shared.shards.memory();
    if memory.is_over() && memory.cached() > 0 && evictions_readable(shared) {
        shared.shards.make_room();
    }
    let applied = shared.shards.with(index, |s| {
        if !s.serving() {
            return Err(redirect(shared, index));
        }
        let reading = match grant {
            Grant::Yes => None,
            Grant::IfExists(refusal) if !s.partition.is_live(op.key()) => return Err(refusal),
            Grant::IfExists(_) => None,
            Grant::IfReads(refusal) => Some(refusal),
        };
        s.calls += 1;
        if let (
            Some(code),
            Op::Create {
                type_name,
                args,
                persistent,
                ..
            },
        ) = (code, &op)
        {
            // A class is logged with the first state of this version in this partition;
            // a module is compiled for every create, and logged before a persistent one.
            if let Some(version) = args.first().and_then(Value::as_str) {
                if *persistent || compiled::is_compiled_type(type_name) {
                    s.partition.offer_class(type_name, version, code)?;
                }
            }
        }
        let deliveries = match reading {
            Some(refusal) => s
                .partition
                .apply_reading(caller, token, seq, op, Instant::now(), refusal),
            None => s.partition.apply(caller, token, seq, acked, op, Instant::now()),
        };
        let deliveries = s.journal(deliveries);
        // User-defined objects' calls go to their hosts before the shard is unlocked, so
        // each host gets them in the order they were applied.
        Ok(Applied {
            deliveries,
            host_actions: hosts::forward(shared, &mut s.partition, code),
        })
    });
    applied.and_then(|r| r)
}

/// Answer the call `parked`, waiting on `key`, with its timeout result now (a client gave
/// up on it). `answer`, if given, then gets `true` if the call was still parked, on the
/// same path (it may wait for the log).
pub(crate) fn withdraw(shared: &Shared, parked: Token, key: &str, answer: Option<Token>) -> Result<Applied, Error> {
    let index = shared.shards.index_of(key);
    shared
        .shards
        .with(index, |s| {
            if !s.serving() {
                return Err(redirect(shared, index));
            }
            let mut deliveries = s.partition.withdraw(parked, key, Instant::now());
            if let Some(answer) = answer {
                let withdrawn = deliveries.iter().any(|d| d.token == parked);
                deliveries.push(Delivery {
                    token: answer,
                    reply: Ok(Value::Boolean(withdrawn)),
                });
            }
            // A withdrawn transaction's copies go, and calls it woke may need hosts.
            Ok(Applied {
                deliveries: s.journal(deliveries),
                host_actions: hosts::forward(shared, &mut s.partition, None),
            })
        })
        .and_then(|r| r)
}

/// The type of the object named `key` (`None`: no such object), for front ends that
/// address objects by name alone.
pub(crate) fn type_of(shared: &Shared, key: &str) -> Result<Option<String>, Error> {
    let index = shared.shards.index_of(key);
    shared
        .shards
        .with(index, |s| match s.serving() {
            true => Ok(s.partition.type_of(key).map(str::to_string)),
            false => Err(redirect(shared, index)),
        })
        .and_then(|r| r)
}

/// The objects whose name starts with `prefix`: `[[name, type], ...]` sorted by name, with
/// each object's size (`[name, type, bytes]`) and unnamed objects too when `all`; only
/// persistent ones if `persistent`. `who`, when given, sees only the names it may read (an
/// unnamed key is a capability: admins only).
pub(crate) fn objects(shared: &Shared, prefix: &str, persistent: bool, all: bool, who: Option<&Principal>) -> Value {
    let shards = &shared.shards;
    let mut named: Vec<(String, String, usize)> = Vec::new();
    // In a cluster each node lists the shards it serves (their leader's view, ephemeral
    // objects included): clients ask every node and merge.
    for index in 0..shards.count() {
        let listed = |s: &mut crate::shards::ShardState| match s.serving() {
            true => s.partition.listing(prefix, persistent, all),
            false => Vec::new(),
        };
        match shards.with(index, listed) {
            Ok(found) => named.extend(found),
            Err(e) => warn!(shard = index, "objects: shard skipped: {e}"),
        }
    }
    if let Some(who) = who {
        let admin = who.allows(Permission::Admin, "");
        named.retain(|(name, ..)| admin || (who.allows(Permission::Read, name) && !name.starts_with(UNNAMED_PREFIX)));
    }
    named.sort_unstable();
    Value::Array(
        named
            .into_iter()
            .map(|(name, type_name, size)| {
                let mut row = vec![Value::from(name), Value::from(type_name)];
                if all {
                    row.push(Value::from(size));
                }
                Value::Array(row)
            })
            .collect(),
    )
}

/// The answer to a call on a shard this node does not serve (in a cluster): `NotLeader`,
/// naming where to go.
pub(crate) fn redirect(shared: &Shared, index: usize) -> Error {
    match &shared.cluster {
        Some(cluster) => cluster.redirect(index),
        None => Error::new(ErrorKind::Internal, format!("shard {index} is not serving")),
    }
}

/// Whether every node reads the records of caches giving room (always on a lone server).
fn evictions_readable(shared: &Shared) -> bool {
    shared
        .cluster
        .as_ref()
        .is_none_or(|cluster| cluster.active_format() >= crate::cluster::format::EVICT)
}
