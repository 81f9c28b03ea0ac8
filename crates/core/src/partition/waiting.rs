//! Parked calls and what ends them: deadlines, withdrawals, disconnects and session ends,
//! and the book-keeping of calls answered after they parked.

use std::sync::Arc;
use std::time::Instant;

use super::{memory, Partition, Storage};
use crate::record::Record;
use crate::{Caller, ConnId, Ctx, Delivery, Token};

pub(super) fn system_caller() -> Caller {
    Caller {
        conn: 0,
        client: Arc::from(""),
        thread: 0,
    }
}

impl Partition {
    /// Answer parked call `token` on `key` at `deadline` (see [`tick`](Self::tick)).
    pub(super) fn set_timer(&mut self, token: Token, key: &str, deadline: Instant) {
        self.timer_seq += 1;
        let at = (deadline, self.timer_seq);
        if let Some(old) = self.timer_of.insert(token, at) {
            self.timers.remove(&old);
        }
        self.timers.insert(at, (key.to_string(), token));
    }

    /// Book-keeping for answered calls: record the replies of parked mutating calls (for
    /// exactly-once retries) and drop their timers.
    pub(super) fn settle(&mut self, out: &[Delivery]) {
        // Most calls leave nothing to settle: no lookups while nothing is parked or hosted.
        if self.timer_of.is_empty()
            && self.hosted.is_empty()
            && self.parked_records.is_empty()
            && self.logged_hosted.is_empty()
            && self.parked_seqs.is_empty()
        {
            return;
        }
        for d in out {
            if let Some(at) = self.timer_of.remove(&d.token) {
                self.timers.remove(&at);
            }
            self.hosted.remove(&d.token);
            let logged = self.parked_records.remove(&d.token).is_some() | self.logged_hosted.remove(&d.token);
            if let Some((client, seq)) = self.parked_seqs.remove(&d.token) {
                self.record_reply(&client, seq, d.reply.clone(), logged);
            }
        }
    }

    /// The earliest deadline of a parked call, for the driver's timer.
    pub fn next_deadline(&self) -> Option<Instant> {
        let parked = self.timers.first_key_value().map(|((d, _), _)| *d);
        match self.next_txn_deadline() {
            Some(txn) => Some(parked.map_or(txn, |p| p.min(txn))),
            None => parked,
        }
    }

    /// Answer parked calls whose deadline has passed.
    pub fn tick(&mut self, now: Instant) -> Vec<Delivery> {
        self.expire_txns(now);
        let mut out = self.wake(now);
        let caller = system_caller();
        while let Some(entry) = self.timers.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let (key, token) = entry.remove();
            self.timer_of.remove(&token);
            self.preserve(&key);
            let Some((e, counted, meter)) = self.objects.get_metered(&key) else {
                continue;
            };
            let persistent = e.persistent;
            if let Some(obj) = e.body.builtin() {
                let before = out.len();
                let mut ctx = Ctx::new(&caller, token, now, &mut out);
                obj.expire(token, &mut ctx);
                // A parked call gone may take what it held (a put's item).
                meter.changed(counted, memory::object_size(&key, obj.size()));
                if persistent && out.len() > before {
                    self.log(Record::Expire { key, token }.encode());
                }
            }
        }
        self.settle(&out);
        out
    }

    /// The caller of a parked call gave up waiting (an interrupted client): answer the call now
    /// with its timeout result, as if its deadline had passed, so the connection stays in step
    /// and keeps what it holds. Returns the replies, the withdrawn call's among them if it was
    /// still parked on `key`. A call running in an object host cannot be withdrawn; a
    /// transaction's call waiting for another's object is, and its transaction aborted.
    pub fn withdraw(&mut self, token: Token, key: &str, now: Instant) -> Vec<Delivery> {
        if self.withdraw_waiting(token, key) {
            return self.wake(now);
        }
        let mut out = Vec::new();
        let caller = system_caller();
        // The call may have been answered by a change still being written: the `withdraw`
        // reply must not overtake that answer.
        self.touched_persistent |= self.storage != Storage::None;
        self.preserve(key);
        let Some((e, counted, meter)) = self.objects.get_metered(key) else {
            return out;
        };
        let persistent = e.persistent;
        if let Some(obj) = e.body.builtin() {
            let mut ctx = Ctx::new(&caller, token, now, &mut out);
            ctx.withdrawing = true;
            obj.expire(token, &mut ctx);
            meter.changed(counted, memory::object_size(key, obj.size()));
        }
        if persistent && !out.is_empty() {
            let key = key.to_string();
            self.log(Record::Expire { key, token }.encode());
        }
        self.settle(&out);
        out
    }

    /// A connection closed: drop its parked calls and release what it held.
    pub fn disconnect(&mut self, conn: ConnId, now: Instant) -> Vec<Delivery> {
        self.drop_waiting_of(conn);
        let mut out = Vec::new();
        if self.logged_conns.remove(&conn) {
            self.log(Record::Disconnect { conn }.encode());
        }
        let caller = system_caller();
        for key in self.conn_keys.remove(&conn).unwrap_or_default() {
            self.preserve(&key);
            if let Some((e, counted, meter)) = self.objects.get_metered(&key) {
                if let Some(obj) = e.body.builtin() {
                    let mut ctx = Ctx::new(&caller, Token { conn: 0, req: 0 }, now, &mut out);
                    obj.disconnect(conn, &mut ctx);
                    meter.changed(counted, memory::object_size(&key, obj.size()));
                }
            }
        }
        // Calls with an object host still run there: a retry must get their reply.
        let hosted = &self.hosted;
        self.parked_seqs.retain(|t, _| t.conn != conn || hosted.contains(t));
        self.parked_records.retain(|t, _| t.conn != conn);
        let timers = &mut self.timers;
        self.timer_of.retain(|t, at| {
            let keep = t.conn != conn;
            if !keep {
                timers.remove(at);
            }
            keep
        });
        out.retain(|d| d.token.conn != conn);
        self.settle(&out);
        out
    }

    /// A session ended: its unnamed objects go, and so does its reply log.
    pub fn end_session(&mut self, client: &str, now: Instant) -> Vec<Delivery> {
        self.end_txns(client);
        let mut out = Vec::new();
        if self.logged_clients.remove(client) {
            let client = client.to_string();
            self.log(Record::EndSession { client }.encode());
        }
        let doomed: Vec<String> = self
            .objects
            .iter()
            .filter(|(_, e)| e.owner.as_deref() == Some(client))
            .map(|(k, _)| k.to_string())
            .collect();
        for key in doomed {
            self.delete(&key, now, &mut out);
        }
        // Calls that waited for its transactions' objects.
        out.extend(self.wake(now));
        self.moved.retain(|_, (_, owner)| owner.as_deref() != Some(client));
        // Parked calls of other sessions answered NotFound keep exactly-once.
        self.settle(&out);
        if let Some(log) = self.logs.remove(client) {
            self.logs_bytes -= log.bytes;
        }
        // Its calls still running in object hosts are answered to closed connections; with
        // the session gone nobody can retry them, so their replies are not recorded.
        self.parked_seqs.retain(|_, (c, _)| **c != *client);
        out
    }
}
