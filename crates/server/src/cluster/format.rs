//! Cluster formats: the version of what the nodes of a cluster write for each other and
//! keep (shards' and the metadata's Raft entries, metadata snapshots, peer frames), so
//! that nodes of two releases run side by side while a cluster is upgraded node by node.
//!
//! Format 1 is the first release's, which wrote no version: data without the mark below is
//! of format 1. Data of a later format starts with the mark, a byte MessagePack never uses
//! (so no format-1 data starts with it), and the format as a MessagePack integer:
//!
//! ```text
//! 0xc1 format body       format >= 2
//! body                   format 1
//! ```
//!
//! A node tells the newest format it reads in its `hello` reply (`cluster_format`), and
//! writes the cluster's active format: the newest that every node of the cluster reads (a
//! node not heard from since this one started counts as format 1). Data of a format newer
//! than a node reads is refused with both formats named; a Raft group that meets such an
//! entry stops applying on that node rather than skip it.
//!
//! A release that changes any of these, or the op-log records that shard entries carry (their
//! own version is `spindle_core::record::RECORD_VERSION`), raises [`NEWEST`] and writes the
//! change only while the active format is the new one: before that, it still writes the
//! older format, which every node of the cluster reads.

pub(crate) use spindle_proto::CLUSTER_FORMAT as NEWEST;

/// The format of a node that tells none (the first release).
pub(crate) const OLDEST: u64 = 1;

/// The first format with metadata entries declaring nodes' liveness (`SetLiveness`): a node
/// of an older one cannot read them, so they are written only once every node reads it.
pub(crate) const LIVENESS: u64 = 2;

/// The first format whose shard entries may carry `evict` records (caches giving room over
/// `--max-memory`): an older node's replay would refuse them, so caches give no room for
/// others until every node reads it (calls are refused with `OutOfMemory` meanwhile).
pub(crate) const EVICT: u64 = 3;

/// The first format whose shard entries may carry two-phase commit's records (`prepare`,
/// `decide`, `decision`, `forget`) and transactions' `commit` records: a cluster runs
/// transactions only once every node reads it.
pub(crate) const TRANSACTIONS: u64 = 4;

/// The first format whose shard entries may carry compiled methods' calls with the replies
/// of their nested calls, and `commit` records that record a method's reply (`nested.rs`):
/// a cluster runs nested calls only once every node reads it.
pub(crate) const NESTED_CALLS: u64 = 5;

/// Starts data of format 2 and later.
const MARK: u8 = 0xc1;

/// Start `out` with the mark of `format` (nothing for format 1).
pub(crate) fn write_mark(out: &mut Vec<u8>, format: u64) {
    if format > OLDEST {
        out.push(MARK);
        // Writing to a Vec cannot fail.
        let _ = rmp::encode::write_uint(out, format);
    }
}

/// `body` in `format`.
pub(crate) fn wrap(format: u64, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + 10);
    write_mark(&mut out, format);
    out.extend_from_slice(body);
    out
}

/// The format of `data` (`what` it is, for errors) and its body; refused when this node
/// does not read that format.
pub(crate) fn open<'a>(data: &'a [u8], what: &str) -> Result<(u64, &'a [u8]), String> {
    let Some((&MARK, mut rest)) = data.split_first() else {
        return Ok((OLDEST, data));
    };
    let format =
        rmp::decode::read_int::<u64, _>(&mut rest).map_err(|_| format!("{what} has a damaged cluster format mark"))?;
    if format <= OLDEST || format > NEWEST {
        return Err(format!(
            "{what} is in cluster format {format}; this node reads cluster formats {OLDEST} to {NEWEST} \
             (upgrade it)"
        ));
    }
    Ok((format, rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_one_is_unmarked_and_later_ones_round_trip() {
        let body = b"\x94\x01\x02\x03\x90";
        assert_eq!(wrap(OLDEST, body), body);
        assert_eq!(open(body, "an entry"), Ok((OLDEST, &body[..])));
        assert_eq!(open(b"", "an entry"), Ok((OLDEST, &b""[..])));
        for format in 2..=NEWEST {
            let data = wrap(format, body);
            assert_eq!(data[0], MARK);
            assert_eq!(open(&data, "an entry"), Ok((format, &body[..])));
        }
    }

    #[test]
    fn a_format_this_node_does_not_read_is_refused_naming_both() {
        let newer = wrap(NEWEST + 1, b"\x90");
        let why = open(&newer, "shard 3's entry 7").unwrap_err();
        assert_eq!(
            why,
            format!(
                "shard 3's entry 7 is in cluster format {}; this node reads cluster formats 1 to {NEWEST} \
                 (upgrade it)",
                NEWEST + 1
            )
        );
        // A mark with no format after it, or claiming format 1 (which has none).
        assert!(open(&[MARK], "x").unwrap_err().contains("damaged"));
        assert!(open(&[MARK, 1, 0x90], "x").is_err());
    }
}
