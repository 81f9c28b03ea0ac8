//! Users, roles and permissions: a pure state machine (no I/O, no clock), changed by
//! [`Change`]s that a standalone server applies and persists, and a cluster replicates
//! through its metadata group, so every node holds the same [`Acl`].
//!
//! As etcd's roles and Redis's ACL key patterns: a role is a list of rules, each granting
//! permissions on the names under a prefix; a user holds roles and a hashed credential.
//! Define, invoke and admin run code or change the server, so they are never per name
//! (define is per type-name prefix).

use std::collections::BTreeMap;
use std::fmt;

use spindle_core::objects::user::USER_PREFIX;
use spindle_core::{Error, ErrorKind, Value};

/// One thing a rule may allow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Permission {
    /// Read-only methods of the objects under the prefix, and listing them.
    Read,
    /// Every other method of those objects.
    Write,
    /// Create, delete and `keep` objects under the prefix.
    Create,
    /// Register the code of user-defined types whose names start with the prefix.
    Define,
    /// Run functions (code that runs as the server's user: see docs/security.md).
    Invoke,
    /// Manage users and roles, and the cluster's nodes.
    Admin,
}

const PERMISSIONS: [(Permission, &str); 6] = [
    (Permission::Read, "read"),
    (Permission::Write, "write"),
    (Permission::Create, "create"),
    (Permission::Define, "define"),
    (Permission::Invoke, "invoke"),
    (Permission::Admin, "admin"),
];

impl Permission {
    fn bit(self) -> u8 {
        1 << self as u8
    }

    pub(crate) fn name(self) -> &'static str {
        PERMISSIONS[self as usize].1
    }
}

/// Permissions on the names starting with `prefix`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Rule {
    prefix: String,
    allowed: u8,
}

impl Rule {
    /// Parse `PERMISSIONS[:PREFIX]`: `read,write:app/`, `all:tmp/`, `invoke`, `define:py:ml.`
    /// (no prefix: every name). `all` is every permission, or with a prefix every one that
    /// is per name.
    pub(crate) fn parse(text: &str) -> Result<Rule, Error> {
        let (names, prefix) = text.split_once(':').unwrap_or((text, ""));
        let global = Permission::Invoke.bit() | Permission::Admin.bit();
        let mut allowed = 0;
        for name in names.split(',').map(str::trim) {
            allowed |= match name {
                "all" if prefix.is_empty() => PERMISSIONS.iter().fold(0, |bits, (p, _)| bits | p.bit()),
                "all" => PERMISSIONS.iter().fold(0, |bits, (p, _)| bits | p.bit()) & !global,
                _ => match PERMISSIONS.iter().find(|(_, n)| *n == name) {
                    Some((p, _)) => p.bit(),
                    None => {
                        return Err(Error::value(format!(
                            "unknown permission '{name}' in rule '{text}' (known: all, {})",
                            PERMISSIONS.map(|(_, n)| n).join(", ")
                        )))
                    }
                },
            };
        }
        if !prefix.is_empty() && allowed & global != 0 {
            return Err(Error::value(format!(
                "rule '{text}': invoke and admin are not per name (they run code or change the \
                 server), so they take no prefix"
            )));
        }
        Ok(Rule {
            prefix: prefix.to_string(),
            allowed,
        })
    }

    /// Whether this rule lets code run: invoke, or define on a prefix that some user-defined
    /// type's name (`py:...`) can start with (`define:tmp/` defines nothing).
    fn runs_code(&self) -> bool {
        let defines = self.allowed & Permission::Define.bit() != 0
            && (self.prefix.starts_with(USER_PREFIX) || USER_PREFIX.starts_with(&self.prefix));
        defines || self.allowed & Permission::Invoke.bit() != 0
    }

    fn allows(&self, permission: Permission, name: &str) -> bool {
        self.allowed & permission.bit() != 0 && name.starts_with(&self.prefix)
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = PERMISSIONS
            .iter()
            .filter(|(p, _)| self.allowed & p.bit() != 0)
            .map(|(_, n)| *n)
            .collect();
        match self.prefix.as_str() {
            "" => write!(f, "{}", names.join(",")),
            prefix => write!(f, "{}:{prefix}", names.join(",")),
        }
    }
}

/// The roles every server has, which cannot be changed or removed.
const BUILT_IN_ROLES: [(&str, &str); 3] = [
    ("admin", "all"),
    ("readwrite", "read,write,create"),
    ("readonly", "read"),
];

/// A user: a hashed credential (PHC string) and roles.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct User {
    pub(crate) hash: String,
    pub(crate) roles: Vec<String>,
}

/// Never the hash: changes are logged (the metadata group logs each entry it applies).
impl fmt::Debug for User {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("User")
            .field("roles", &self.roles)
            .finish_non_exhaustive()
    }
}

/// A change as the log shows it (never a credential or its hash).
impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Change::SetUser { name, user } => write!(f, "set user '{name}' with roles {:?}", user.roles),
            Change::RemoveUser { name } => write!(f, "removed user '{name}'"),
            Change::SetRole { name, rules } => write!(f, "set role '{name}' to {rules:?}"),
            Change::RemoveRole { name } => write!(f, "removed role '{name}'"),
        }
    }
}

/// A change of the users or roles (an entry of the metadata group in a cluster).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Change {
    SetUser { name: String, user: User },
    RemoveUser { name: String },
    SetRole { name: String, rules: Vec<String> },
    RemoveRole { name: String },
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Acl {
    users: BTreeMap<String, User>,
    /// Roles defined by the administrators (the built-in ones are not stored).
    roles: BTreeMap<String, Vec<Rule>>,
}

/// What one authenticated party may do: the rules of all its roles.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Principal {
    pub(crate) user: String,
    rules: Vec<Rule>,
    /// The user's stored hash when it authenticated: a new credential ends its connections.
    pub(crate) credential: String,
}

/// The user a single `--token` (or a server without credentials) authenticates as.
pub(crate) const DEFAULT_USER: &str = "default";

/// The user name nodes of a cluster say `hello` as, with the cluster key (no user can take
/// it: user names start with a letter or digit).
pub(crate) const NODE_USER: &str = "~node";

impl Principal {
    /// The default user: everything allowed (a server's own token, or a server without any
    /// credential, as before users existed).
    pub(crate) fn default_user() -> Principal {
        Principal {
            user: DEFAULT_USER.into(),
            rules: vec![Rule::parse("all").expect("a valid rule")],
            credential: String::new(),
        }
    }

    /// A node of the cluster: everything, peer operations included.
    pub(crate) fn node() -> Principal {
        Principal {
            user: NODE_USER.into(),
            ..Principal::default_user()
        }
    }

    pub(crate) fn is_node(&self) -> bool {
        self.user == NODE_USER
    }

    pub(crate) fn allows(&self, permission: Permission, name: &str) -> bool {
        self.rules.iter().any(|r| r.allows(permission, name))
    }

    /// `Ok` if allowed, else the `PermissionDenied` naming the operation and the name.
    pub(crate) fn check(&self, permission: Permission, op: &str, name: &str) -> Result<(), Error> {
        if self.allows(permission, name) {
            return Ok(());
        }
        let on = match name {
            "" => String::new(),
            name => format!(" on '{}'", cut(name)),
        };
        Err(Error::new(
            ErrorKind::PermissionDenied,
            format!(
                "user '{}' may not {}{on}: that needs the {} permission",
                self.user,
                cut(op),
                permission.name()
            ),
        ))
    }

    /// Whether this party may run code (its pickles are trusted by readers: see
    /// docs/security.md).
    pub(crate) fn runs_code(&self) -> bool {
        self.rules.iter().any(Rule::runs_code)
    }
}

/// User and role names: short, printable, and never one a node or the default user takes.
fn check_name(kind: &str, name: &str) -> Result<(), Error> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.chars().all(|c| c.is_ascii_alphanumeric() || "_.-@".contains(c))
        && name.chars().next().is_some_and(|c| c.is_ascii_alphanumeric());
    match ok {
        true => Ok(()),
        false => Err(Error::value(format!(
            "bad {kind} name '{name}': 1 to 64 of letters, digits, '_', '.', '-' and '@', starting \
             with a letter or digit"
        ))),
    }
}

impl Acl {
    /// Whether any user exists (then a `hello` must name one, or give the server's token).
    pub(crate) fn has_users(&self) -> bool {
        !self.users.is_empty()
    }

    /// Whether some user may manage the users and roles.
    pub(crate) fn has_admin(&self) -> bool {
        self.users
            .keys()
            .any(|name| self.principal(name).is_some_and(|p| p.allows(Permission::Admin, "")))
    }

    pub(crate) fn user(&self, name: &str) -> Option<&User> {
        self.users.get(name)
    }

    /// What user `name` may do now (`None`: no such user).
    pub(crate) fn principal(&self, name: &str) -> Option<Principal> {
        let user = self.users.get(name)?;
        let rules = user.roles.iter().flat_map(|role| self.rules(role)).collect();
        Some(Principal {
            user: name.to_string(),
            rules,
            credential: user.hash.clone(),
        })
    }

    fn rules(&self, role: &str) -> Vec<Rule> {
        match BUILT_IN_ROLES.iter().find(|(name, _)| *name == role) {
            Some((_, rule)) => vec![Rule::parse(rule).expect("built-in rules parse")],
            None => self.roles.get(role).cloned().unwrap_or_default(),
        }
    }

    /// Whether `change` may be made now, and why not.
    pub(crate) fn check(&self, change: &Change) -> Result<(), Error> {
        match change {
            Change::SetUser { name, user } => {
                check_name("user", name)?;
                if name == DEFAULT_USER {
                    return Err(Error::value(format!(
                        "'{DEFAULT_USER}' is the user of the server's own token; choose another name"
                    )));
                }
                for role in &user.roles {
                    if !self.is_role(role) {
                        return Err(Error::value(format!("no role '{role}' (see: spindle role list)")));
                    }
                }
                Ok(())
            }
            Change::RemoveUser { name } if !self.users.contains_key(name) => {
                Err(Error::new(ErrorKind::NotFound, format!("no user '{name}'")))
            }
            Change::RemoveUser { .. } => Ok(()),
            Change::SetRole { name, rules } => {
                check_name("role", name)?;
                if BUILT_IN_ROLES.iter().any(|(n, _)| n == name) {
                    return Err(Error::value(format!("'{name}' is a built-in role")));
                }
                rules.iter().try_for_each(|r| Rule::parse(r).map(drop))
            }
            Change::RemoveRole { name } => {
                if BUILT_IN_ROLES.iter().any(|(n, _)| n == name) {
                    return Err(Error::value(format!("'{name}' is a built-in role")));
                }
                if !self.roles.contains_key(name) {
                    return Err(Error::new(ErrorKind::NotFound, format!("no role '{name}'")));
                }
                let holders: Vec<&str> = self
                    .users
                    .iter()
                    .filter(|(_, u)| u.roles.contains(name))
                    .map(|(n, _)| n.as_str())
                    .collect();
                match holders.is_empty() {
                    true => Ok(()),
                    false => Err(Error::value(format!(
                        "role '{name}' is held by {}: take it from them first",
                        holders.join(", ")
                    ))),
                }
            }
        }
    }

    fn is_role(&self, name: &str) -> bool {
        self.roles.contains_key(name) || BUILT_IN_ROLES.iter().any(|(n, _)| *n == name)
    }

    /// Apply a change that [`Acl::check`] passed (replayed ones were checked when proposed;
    /// rules that no longer parse are skipped rather than trusted).
    pub(crate) fn apply(&mut self, change: Change) {
        match change {
            Change::SetUser { name, user } => {
                self.users.insert(name, user);
            }
            Change::RemoveUser { name } => {
                self.users.remove(&name);
            }
            Change::SetRole { name, rules } => {
                let rules = rules.iter().filter_map(|r| Rule::parse(r).ok()).collect();
                self.roles.insert(name, rules);
            }
            Change::RemoveRole { name } => {
                self.roles.remove(&name);
            }
        }
    }

    /// The changes that rebuild this ACL from an empty one (roles first).
    pub(crate) fn changes(&self) -> Vec<Change> {
        let roles = self.roles.iter().map(|(name, rules)| Change::SetRole {
            name: name.clone(),
            rules: rules.iter().map(Rule::to_string).collect(),
        });
        let users = self.users.iter().map(|(name, user)| Change::SetUser {
            name: name.clone(),
            user: user.clone(),
        });
        roles.chain(users).collect()
    }

    /// The users and their roles, for `spindle user list` (never their hashes).
    pub(crate) fn list_users(&self) -> Value {
        Value::Array(
            self.users
                .iter()
                .map(|(name, user)| {
                    Value::Map(vec![
                        ("name".into(), name.as_str().into()),
                        ("roles".into(), strings(&user.roles)),
                    ])
                })
                .collect(),
        )
    }

    /// Every role, built-in ones first, with its rules.
    pub(crate) fn list_roles(&self) -> Value {
        let built_in = BUILT_IN_ROLES
            .iter()
            .map(|(n, r)| (n.to_string(), vec![r.to_string()], true));
        let defined = self
            .roles
            .iter()
            .map(|(n, rules)| (n.clone(), rules.iter().map(Rule::to_string).collect(), false));
        Value::Array(
            built_in
                .chain(defined)
                .map(|(name, rules, built_in): (String, Vec<String>, bool)| {
                    Value::Map(vec![
                        ("name".into(), name.into()),
                        ("rules".into(), strings(&rules)),
                        ("built_in".into(), built_in.into()),
                    ])
                })
                .collect(),
        )
    }
}

/// A client's name or method as a message shows it: cut short, so a huge one cannot bloat
/// the reply or the audit log.
fn cut(text: &str) -> String {
    const MAX: usize = 200;
    match text.char_indices().nth(MAX) {
        Some((i, _)) => format!("{}...", &text[..i]),
        None => text.to_string(),
    }
}

fn strings(items: &[String]) -> Value {
    Value::Array(items.iter().map(|s| Value::from(s.as_str())).collect())
}

impl Change {
    pub(crate) fn to_value(&self) -> Value {
        match self {
            Change::SetUser { name, user } => Value::Array(vec![
                "set_user".into(),
                name.as_str().into(),
                user.hash.as_str().into(),
                strings(&user.roles),
            ]),
            Change::RemoveUser { name } => Value::Array(vec!["remove_user".into(), name.as_str().into()]),
            Change::SetRole { name, rules } => {
                Value::Array(vec!["set_role".into(), name.as_str().into(), strings(rules)])
            }
            Change::RemoveRole { name } => Value::Array(vec!["remove_role".into(), name.as_str().into()]),
        }
    }

    pub(crate) fn from_value(value: &Value) -> Result<Change, String> {
        let items = value.as_array().ok_or("an ACL change is not an array")?;
        let text = |i: usize| -> Result<String, String> {
            items
                .get(i)
                .and_then(Value::as_str)
                .map(str::to_string)
                .ok_or_else(|| format!("an ACL change lacks string {i}"))
        };
        let list = |i: usize| -> Result<Vec<String>, String> {
            items
                .get(i)
                .and_then(Value::as_array)
                .ok_or_else(|| format!("an ACL change lacks list {i}"))?
                .iter()
                .map(|v| {
                    v.as_str()
                        .map(str::to_string)
                        .ok_or_else(|| "a list item is not a string".into())
                })
                .collect()
        };
        match text(0)?.as_str() {
            "set_user" => Ok(Change::SetUser {
                name: text(1)?,
                user: User {
                    hash: text(2)?,
                    roles: list(3)?,
                },
            }),
            "remove_user" => Ok(Change::RemoveUser { name: text(1)? }),
            "set_role" => Ok(Change::SetRole {
                name: text(1)?,
                rules: list(2)?,
            }),
            "remove_role" => Ok(Change::RemoveRole { name: text(1)? }),
            other => Err(format!("an unknown ACL change '{other}'")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn role(acl: &mut Acl, name: &str, rules: &[&str]) {
        let change = Change::SetRole {
            name: name.into(),
            rules: rules.iter().map(|r| r.to_string()).collect(),
        };
        acl.check(&change).unwrap();
        acl.apply(change);
    }

    fn user(acl: &mut Acl, name: &str, roles: &[&str]) {
        let change = Change::SetUser {
            name: name.into(),
            user: User {
                hash: "h".into(),
                roles: roles.iter().map(|r| r.to_string()).collect(),
            },
        };
        acl.check(&change).unwrap();
        acl.apply(change);
    }

    #[test]
    fn rules_grant_per_prefix() {
        let mut acl = Acl::default();
        role(
            &mut acl,
            "app",
            &["read,write:app/", "create:app/tmp/", "define:py:app."],
        );
        user(&mut acl, "alice", &["app"]);
        let alice = acl.principal("alice").unwrap();
        assert!(alice.allows(Permission::Read, "app/x"));
        assert!(alice.allows(Permission::Write, "app/x"));
        assert!(!alice.allows(Permission::Create, "app/x"));
        assert!(alice.allows(Permission::Create, "app/tmp/x"));
        assert!(!alice.allows(Permission::Read, "other"));
        assert!(alice.allows(Permission::Define, "py:app.Model"));
        assert!(!alice.allows(Permission::Define, "py:other.Model"));
        assert!(!alice.allows(Permission::Invoke, ""));
        assert!(alice.runs_code(), "define lets her code run in object hosts");
        role(&mut acl, "tmp", &["all:tmp/"]);
        user(&mut acl, "mallory", &["tmp"]);
        let mallory = acl.principal("mallory").unwrap();
        assert!(mallory.allows(Permission::Define, "tmp/x"));
        assert!(
            !mallory.runs_code(),
            "all:tmp/ defines no type: her pickles are not trusted"
        );
        role(&mut acl, "py", &["define:p"]);
        user(&mut acl, "pat", &["py"]);
        assert!(acl.principal("pat").unwrap().runs_code(), "define:p can define py:...");
        let e = alice.check(Permission::Create, "delete", "app/x").unwrap_err();
        assert_eq!(e.kind, ErrorKind::PermissionDenied);
        assert_eq!(
            e.message,
            "user 'alice' may not delete on 'app/x': that needs the create permission"
        );
        assert!(acl.principal("bob").is_none());
    }

    #[test]
    fn built_in_roles_and_the_default_user() {
        let mut acl = Acl::default();
        user(&mut acl, "reader", &["readonly"]);
        user(&mut acl, "root", &["admin"]);
        let reader = acl.principal("reader").unwrap();
        assert!(reader.allows(Permission::Read, "anything"));
        assert!(!reader.allows(Permission::Write, "anything"));
        assert!(!reader.runs_code());
        assert!(acl.principal("root").unwrap().allows(Permission::Admin, ""));
        assert!(Principal::default_user().allows(Permission::Invoke, ""));
        let admin = Change::SetRole {
            name: "admin".into(),
            rules: vec!["read".into()],
        };
        assert!(acl.check(&admin).is_err(), "built-in roles stay");
        let default = Change::SetUser {
            name: DEFAULT_USER.into(),
            user: User {
                hash: "h".into(),
                roles: vec![],
            },
        };
        assert!(acl.check(&default).is_err());
    }

    #[test]
    fn bad_rules_names_and_roles_are_refused() {
        for bad in ["reed", "invoke:app/", "admin:x", "read,,write"] {
            assert!(Rule::parse(bad).is_err(), "{bad}");
        }
        let acl = Acl::default();
        let unknown = Change::SetUser {
            name: "eve".into(),
            user: User {
                hash: "h".into(),
                roles: vec!["nope".into()],
            },
        };
        assert!(acl.check(&unknown).unwrap_err().message.contains("no role 'nope'"));
        for name in ["", "~node", "a b", &"x".repeat(65)] {
            let change = Change::RemoveRole { name: name.into() };
            let set = Change::SetRole {
                name: name.into(),
                rules: vec![],
            };
            assert!(acl.check(&set).is_err(), "{name:?}");
            assert!(acl.check(&change).is_err());
        }
    }

    #[test]
    fn a_held_role_is_not_removed() {
        let mut acl = Acl::default();
        role(&mut acl, "ops", &["all:ops/"]);
        assert_eq!(acl.list_roles().as_array().unwrap().len(), 4);
        let rules = Rule::parse("all:ops/").unwrap();
        assert_eq!(rules.to_string(), "read,write,create,define:ops/");
        user(&mut acl, "carol", &["ops"]);
        let remove = Change::RemoveRole { name: "ops".into() };
        assert!(acl.check(&remove).unwrap_err().message.contains("carol"));
    }

    #[test]
    fn changes_rebuild_the_acl_and_round_trip() {
        let mut acl = Acl::default();
        role(&mut acl, "app", &["read,write:app/", "invoke"]);
        user(&mut acl, "alice", &["app", "readonly"]);
        let mut rebuilt = Acl::default();
        for change in acl.changes() {
            let decoded = Change::from_value(&change.to_value()).unwrap();
            assert_eq!(decoded, change);
            rebuilt.apply(decoded);
        }
        assert_eq!(rebuilt, acl);
        assert!(Change::from_value(&Value::from("x")).is_err());
        assert!(Change::from_value(&Value::Array(vec!["set_user".into()])).is_err());
    }
}
