//! Who may connect, and as whom: credentials checked against the [`Acl`], which lives here
//! behind a lock, persisted beside a standalone server's data (`<data-dir>/acl`; a cluster
//! keeps it in its metadata group instead).
//!
//! A `hello` authenticates as one of:
//! - a user (`user` and its token or password, stored as an Argon2id hash);
//! - the default user, with the server's own token (`--token`, or one made up at start for
//!   the server's workers and hosts): everything allowed, as before users existed;
//! - a node of the cluster ([`NODE_USER`], with the cluster key): peer operations;
//! - the default user without any token, only while the server has no credential at all.

use ahash::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};

use argon2::password_hash::rand_core::{OsRng, RngCore};
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::Argon2;
use sha2::{Digest, Sha256};
use spindle_core::{Error, ErrorKind, Value};

use spindle_core::objects;
use spindle_core::partition::UNNAMED_PREFIX;
use spindle_proto::Request;

use crate::acl::{Acl, Change, Permission, Principal, DEFAULT_USER, NODE_USER};
use crate::process::constant_time_eq;

/// Verified credentials remembered (digests only); past it, the memory starts over.
const MAX_VERIFIED: usize = 4096;

pub(crate) struct Access {
    acl: RwLock<Acl>,
    /// Bumped by every change, so connections know to look up their user's rules again.
    generation: AtomicU64,
    server_token: String,
    /// Whether `server_token` was configured (`--token`), rather than made up.
    configured: bool,
    cluster_key: Option<String>,
    /// Whether the users and roles are known: a cluster node learns them from its metadata
    /// group, and until then serves its peers only (it cannot tell who else may do what).
    ready: AtomicBool,
    /// Where a standalone server keeps the ACL.
    file: Option<PathBuf>,
    /// Digests of (user, hash, credential) that verified: Argon2 runs once per credential,
    /// not on every connection of a client with many threads.
    verified: Mutex<HashSet<[u8; 32]>>,
    /// Held while Argon2 runs.
    hashing: Mutex<()>,
}

/// What an unknown user's credential is checked against (and never matches: its hash
/// stands for random bytes, and the user does not exist anyway).
static DUMMY_HASH: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| hash_credential(&made_up_token()).expect("hashing a made-up token"));

impl Access {
    /// `token`: `--token`; `cluster_key`: what nodes give each other; `dir`: a standalone
    /// server's data directory (the ACL is loaded from it).
    pub(crate) fn open(token: Option<&str>, cluster_key: Option<&str>, dir: Option<&Path>) -> std::io::Result<Self> {
        let file = dir.map(|d| d.join("acl"));
        let mut acl = Acl::default();
        if let Some(file) = &file {
            for change in load(file)? {
                acl.apply(change);
            }
        }
        Ok(Access {
            acl: RwLock::new(acl),
            generation: AtomicU64::new(0),
            server_token: token.map_or_else(made_up_token, str::to_string),
            configured: token.is_some(),
            cluster_key: cluster_key.map(str::to_string),
            ready: AtomicBool::new(cluster_key.is_none()),
            file,
            verified: Mutex::new(HashSet::default()),
            hashing: Mutex::new(()),
        })
    }

    /// The token the server's own workers and object hosts connect with.
    pub(crate) fn server_token(&self) -> &str {
        &self.server_token
    }

    pub(crate) fn cluster_key(&self) -> Option<&str> {
        self.cluster_key.as_deref()
    }

    /// Whether a `hello` must carry a credential.
    pub(crate) fn required(&self) -> bool {
        self.configured || self.read().has_users()
    }

    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Acl> {
        self.acl.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Who a `hello` with these credentials is, or why it is refused (`Unauthorized`).
    pub(crate) fn authenticate(&self, user: Option<&str>, token: Option<&str>) -> Result<Principal, Error> {
        let refused = |message: &str| Err(Error::new(ErrorKind::Unauthorized, message));
        if user != Some(NODE_USER) && !self.ready.load(Ordering::Acquire) {
            // As a node without a leader answers: clients try again, here or elsewhere.
            return Err(Error::new(
                ErrorKind::NotLeader,
                "this node has not caught up with its cluster's users and roles yet; retry shortly",
            ));
        }
        match (user, token) {
            (Some(NODE_USER), Some(token)) => match &self.cluster_key {
                Some(key) if same(key, token) => Ok(Principal::node()),
                _ => refused("wrong cluster key"),
            },
            (Some(name), Some(token)) => {
                // Copied out: no lock is held while Argon2 runs (tens of milliseconds).
                let hash = self.read().user(name).map(|user| user.hash.clone());
                // An unknown user costs a hash too, so timing does not tell which names exist.
                let ok = self.verify(name, hash.as_deref().unwrap_or(&DUMMY_HASH), token) && hash.is_some();
                match ok.then(|| self.read().principal(name)).flatten() {
                    Some(principal) => Ok(principal),
                    None => refused("wrong user or token"),
                }
            }
            (Some(_), None) => refused("a user needs its token (SPINDLE_TOKEN)"),
            (None, Some(token)) if same(&self.server_token, token) => Ok(Principal::default_user()),
            (None, Some(_)) => refused("wrong token"),
            (None, None) if self.required() => refused(
                "this server needs credentials: pass \"user\" and \"token\" in hello (the SDK and \
                 the spindle command read SPINDLE_USER and SPINDLE_TOKEN)",
            ),
            (None, None) => Ok(Principal::default_user()),
        }
    }

    /// Whether `token` is the credential `hash` stands for. Argon2 runs one at a time (its
    /// memory is bounded) and off the connection's runtime thread, so a client hammering
    /// `hello` with guesses does not stall other connections.
    fn verify(&self, name: &str, hash: &str, token: &str) -> bool {
        let digest: [u8; 32] = Sha256::new()
            .chain_update(name.as_bytes())
            .chain_update([0])
            .chain_update(hash.as_bytes())
            .chain_update([0])
            .chain_update(token.as_bytes())
            .finalize()
            .into();
        if self
            .verified
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&digest)
        {
            return true;
        }
        let check = || {
            let _one = self.hashing.lock().unwrap_or_else(|e| e.into_inner());
            PasswordHash::new(hash).is_ok_and(|hash| Argon2::default().verify_password(token.as_bytes(), &hash).is_ok())
        };
        let ok = match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
            Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(check),
            _ => check(),
        };
        if ok {
            let mut verified = self.verified.lock().unwrap_or_else(|e| e.into_inner());
            if verified.len() >= MAX_VERIFIED {
                verified.clear();
            }
            verified.insert(digest);
        }
        ok
    }

    /// What user `name` may do now (after a change): `None` once it is gone.
    pub(crate) fn principal(&self, name: &str) -> Option<Principal> {
        match name {
            DEFAULT_USER => Some(Principal::default_user()),
            NODE_USER => Some(Principal::node()),
            name => self.read().principal(name),
        }
    }

    /// Check `change` against the ACL now (the one place a change is refused).
    pub(crate) fn check(&self, change: &Change) -> Result<(), Error> {
        let acl = self.read();
        acl.check(change)?;
        // Without a token of its own, a server whose users hold no admin role could never
        // be managed again.
        if !self.configured {
            let mut next = acl.clone();
            next.apply(change.clone());
            if next.has_users() && !next.has_admin() {
                return Err(Error::value(
                    "this change would leave no user with the admin role on a server without \
                     --token: nobody could manage its users again (add an admin user first)",
                ));
            }
        }
        Ok(())
    }

    /// Apply a checked change (a standalone server's, or one the metadata group committed)
    /// and persist it with the standalone server's data.
    pub(crate) fn apply(&self, change: Change) -> Result<(), Error> {
        let mut acl = self.acl.write().unwrap_or_else(|e| e.into_inner());
        let mut next = acl.clone();
        next.apply(change);
        if let Some(file) = &self.file {
            save(file, &next).map_err(|e| {
                Error::new(
                    ErrorKind::StorageError,
                    format!("could not save the users and roles: {e}"),
                )
            })?;
        }
        *acl = next;
        self.generation.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    /// Replace the ACL (with the one a cluster's metadata group holds now).
    pub(crate) fn set(&self, acl: Acl) {
        *self.acl.write().unwrap_or_else(|e| e.into_inner()) = acl;
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// The users and roles are known (a cluster node's metadata lists it: every change
    /// before its membership is applied).
    pub(crate) fn set_ready(&self) {
        self.ready.store(true, Ordering::Release);
    }

    pub(crate) fn list_users(&self) -> Value {
        self.read().list_users()
    }

    pub(crate) fn list_roles(&self) -> Value {
        self.read().list_roles()
    }
}

/// The one gate of authorization: whether `who` may make `request` (docs/security.md lists
/// what each operation needs). `list` of `objects` is filtered per name instead.
pub(crate) fn permit(who: &Principal, request: &Request) -> Result<Grant, Error> {
    use Permission::{Admin, Create, Define, Invoke, Read, Write};
    if let Request::Create { key, .. } = request {
        // A `create` of an object that exists is how SDKs attach to it: a reader may.
        return match on_object(who, Create, "create", key) {
            Err(e) if who.allows(Read, key) => Ok(Grant::IfExists(e)),
            other => other.map(|()| Grant::Yes),
        };
    }
    match request {
        Request::Call {
            type_name, key, method, ..
        } => match objects::is_read(type_name, method) {
            true => on_object(who, Read, method, key),
            false => match on_object(who, Write, method, key) {
                // Whether a compiled object's method writes is known once it ran.
                Err(e)
                    if objects::compiled::is_compiled_type(type_name) && on_object(who, Read, method, key).is_ok() =>
                {
                    return Ok(Grant::IfReads(e))
                }
                other => other,
            },
        },
        Request::Delete { key, .. } => on_object(who, Create, "delete", key),
        Request::Keep { key, name, .. } => {
            on_object(who, Create, "keep", key)?;
            name.as_deref()
                .map_or(Ok(()), |name| on_object(who, Create, "keep", name))
        }
        Request::Define { type_name, .. } => {
            return match who.check(Define, "define", type_name) {
                Err(e) => Ok(Grant::IfExists(e)),
                Ok(()) => Ok(Grant::Yes),
            }
        }
        Request::Invoke { .. } => who.check(Invoke, "invoke functions", ""),
        Request::Calls { .. } => who.check(Invoke, "look at or stop function calls", ""),
        Request::Join { .. } | Request::Leave { .. } => who.check(Admin, "change the cluster's nodes", ""),
        Request::Acl { action, .. } if action != "whoami" => who.check(Admin, "manage users and roles", ""),
        Request::Adopt { .. }
        | Request::Prepare { .. }
        | Request::Decide { .. }
        | Request::Decision { .. }
        | Request::Snapshot { .. }
        | Request::Raft { .. }
            if !who.is_node() =>
        {
            Err(Error::new(
                ErrorKind::PermissionDenied,
                format!("'{}' is an operation between the nodes of a cluster", request.op()),
            ))
        }
        _ => Ok(()),
    }
    .map(|()| Grant::Yes)
}

/// What [`permit`] allows.
#[derive(Debug)]
pub(crate) enum Grant {
    Yes,
    /// Only if what it names exists already (checked under its lock), else this refusal: a
    /// `create` of an existing object (attaching to it, which reading allows), or a `define`
    /// of a version already defined (which changes nothing: SDKs define before they create).
    IfExists(Error),
    /// Only if the call leaves the object as it was, else this refusal: a reader's call of a
    /// compiled object's method (`Partition::apply_reading`).
    IfReads(Error),
}

/// An object's key or name: an unnamed object's key is its capability (only sessions that
/// were handed its proxy know it), so rules cover named objects.
fn on_object(who: &Principal, permission: Permission, op: &str, key: &str) -> Result<(), Error> {
    match key.starts_with(UNNAMED_PREFIX) {
        true => Ok(()),
        false => who.check(permission, op, key),
    }
}

/// The stored form of a user's token or password: an Argon2id hash in PHC format.
pub(crate) fn hash_credential(credential: &str) -> Result<String, Error> {
    let salt = SaltString::generate(&mut OsRng);
    Argon2::default()
        .hash_password(credential.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|e| Error::new(ErrorKind::Internal, format!("could not hash the credential: {e}")))
}

/// Constant-time equality, so a wrong guess does not tell how much of it was right.
fn same(a: &str, b: &str) -> bool {
    constant_time_eq(a.as_bytes(), b.as_bytes())
}

fn made_up_token() -> String {
    let mut bytes = [0u8; 24];
    OsRng.fill_bytes(&mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn load(file: &Path) -> std::io::Result<Vec<Change>> {
    let bytes = match std::fs::read(file) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let bad = |why: String| std::io::Error::other(format!("{}: {why}", file.display()));
    let value = rmpv::decode::read_value(&mut &bytes[..]).map_err(|e| bad(e.to_string()))?;
    value
        .as_array()
        .ok_or_else(|| bad("not a list of changes".into()))?
        .iter()
        .map(|c| Change::from_value(c).map_err(bad))
        .collect()
}

/// Write the ACL as the changes that rebuild it: a whole new file, then renamed over the old
/// one, so a crash leaves one or the other.
fn save(file: &Path, acl: &Acl) -> std::io::Result<()> {
    let changes = Value::Array(acl.changes().iter().map(Change::to_value).collect());
    let mut bytes = Vec::new();
    rmpv::encode::write_value(&mut bytes, &changes).map_err(std::io::Error::other)?;
    let tmp = file.with_extension("tmp");
    {
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode_private()
            .open(&tmp)?;
        out.write_all(&bytes)?;
        out.sync_all()?;
    }
    std::fs::rename(&tmp, file)?;
    spindle_storage::sync_dir(file.parent().unwrap_or(Path::new(".")))
}

/// Files holding hashes are readable by the server's user only.
trait PrivateMode {
    fn mode_private(&mut self) -> &mut Self;
}

impl PrivateMode for std::fs::OpenOptions {
    fn mode_private(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.mode(0o600)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::acl::User;

    fn set_user(access: &Access, name: &str, token: &str, roles: &[&str]) {
        let change = Change::SetUser {
            name: name.into(),
            user: User {
                hash: hash_credential(token).unwrap(),
                roles: roles.iter().map(|r| r.to_string()).collect(),
            },
        };
        access.check(&change).unwrap();
        access.apply(change).unwrap();
    }

    #[test]
    fn credentials_authenticate_users_and_are_stored_hashed() {
        let dir = tempdir();
        let access = Access::open(None, None, Some(&dir)).unwrap();
        assert!(!access.required());
        assert_eq!(access.authenticate(None, None).unwrap().user, "default");
        let reader = Change::SetUser {
            name: "alice".into(),
            user: User {
                hash: hash_credential("alice-token").unwrap(),
                roles: vec!["readonly".into()],
            },
        };
        let refused = access.check(&reader).unwrap_err();
        assert!(
            refused.message.contains("no user with the admin role"),
            "{}",
            refused.message
        );
        set_user(&access, "root", "root-token", &["admin"]);
        set_user(&access, "alice", "alice-token", &["readonly"]);
        assert!(access.check(&Change::RemoveUser { name: "root".into() }).is_err());
        assert!(access.required(), "a user exists: credentials are needed");
        let kind = |r: Result<Principal, Error>| r.unwrap_err().kind;
        assert_eq!(kind(access.authenticate(None, None)), ErrorKind::Unauthorized);
        assert_eq!(
            kind(access.authenticate(Some("alice"), Some("nope"))),
            ErrorKind::Unauthorized
        );
        assert_eq!(
            kind(access.authenticate(Some("bob"), Some("x"))),
            ErrorKind::Unauthorized
        );
        assert_eq!(
            kind(access.authenticate(Some(NODE_USER), Some("x"))),
            ErrorKind::Unauthorized
        );
        let alice = access.authenticate(Some("alice"), Some("alice-token")).unwrap();
        assert_eq!(alice.user, "alice");
        // Again, from the memory of verified credentials.
        assert!(access.authenticate(Some("alice"), Some("alice-token")).is_ok());
        let token = access.server_token().to_string();
        assert_eq!(access.authenticate(None, Some(&token)).unwrap().user, "default");

        let stored = std::fs::read(dir.join("acl")).unwrap();
        assert!(!String::from_utf8_lossy(&stored).contains("alice-token"));
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.join("acl")).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        // A restart loads them; a new password replaces the old one.
        let reopened = Access::open(Some("t0ken"), Some("key"), Some(&dir)).unwrap();
        // A cluster node serves only its peers until it knows the users and roles.
        assert_eq!(
            kind(reopened.authenticate(Some("alice"), Some("alice-token"))),
            ErrorKind::NotLeader
        );
        assert_eq!(kind(reopened.authenticate(None, None)), ErrorKind::NotLeader);
        assert!(reopened.authenticate(Some(NODE_USER), Some("key")).is_ok());
        reopened.set_ready();
        assert!(reopened.authenticate(Some("alice"), Some("alice-token")).is_ok());
        set_user(&reopened, "alice", "new", &["readonly"]);
        assert!(reopened.authenticate(Some("alice"), Some("alice-token")).is_err());
        assert_eq!(
            reopened.authenticate(Some(NODE_USER), Some("key")).unwrap().user,
            NODE_USER
        );
        assert!(reopened.authenticate(None, Some("t0ken")).is_ok());
        std::fs::remove_dir_all(dir).unwrap();
    }

    fn tempdir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!("spindle-access-{}-{}", std::process::id(), made_up_token()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}
