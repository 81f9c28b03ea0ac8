//! `spindle user ...` and `spindle role ...`: the server's users and roles (docs/security.md).
//! Changes need a user with the admin permission (or the server's own token).

use std::io::{BufRead, IsTerminal};

use clap::{Args, Subcommand};
use spindle_core::Value;

use crate::client::{self, field, Client};
use crate::AddressArg;

#[derive(Args)]
pub(crate) struct UserArgs {
    #[command(subcommand)]
    command: UserCommand,
    #[command(flatten)]
    address: AddressArg,
}

#[derive(Subcommand)]
enum UserCommand {
    /// Add a user, or replace one's credential and roles. Prints a new random token for it,
    /// unless --password-stdin reads a password (12 characters at least) instead.
    Add {
        name: String,
        /// A role it holds (repeat for more): a built-in one (admin, readwrite, readonly) or
        /// one made with `spindle role add`.
        #[arg(long = "role", value_name = "ROLE", required = true)]
        roles: Vec<String>,
        /// Read the user's password from the first line of stdin.
        #[arg(long)]
        password_stdin: bool,
    },
    /// Remove a user: its connections can do nothing more.
    Remove { name: String },
    /// List the users and their roles.
    List,
    /// Show who this client is to the server.
    Whoami,
}

#[derive(Args)]
pub(crate) struct RoleArgs {
    #[command(subcommand)]
    command: RoleCommand,
    #[command(flatten)]
    address: AddressArg,
}

#[derive(Subcommand)]
enum RoleCommand {
    /// Define a role, or replace one's rules. A rule is PERMISSIONS[:PREFIX]: permissions
    /// among read, write, create (create, delete, keep), define (types whose names start
    /// with PREFIX), invoke, admin, or all; on the names starting with PREFIX (none: every
    /// name). Example: `spindle role add app read,write,create:app/ invoke`.
    Add {
        name: String,
        #[arg(required = true, value_name = "RULE")]
        rules: Vec<String>,
    },
    /// Remove a role no user holds.
    Remove { name: String },
    /// List the roles and their rules.
    List,
}

pub(crate) fn user(args: UserArgs) -> Result<(), String> {
    let mut client = Client::connect(&args.address.address)?;
    match args.command {
        UserCommand::Add {
            name,
            roles,
            password_stdin,
        } => {
            let token = match password_stdin {
                true => read_password()?,
                false => client::new_token()?,
            };
            let roles = Value::Array(roles.into_iter().map(Value::from).collect());
            let operands = vec![
                ("name", Value::from(name.as_str())),
                ("token", Value::from(token.as_str())),
                ("roles", roles),
            ];
            client.acl("set_user", operands)?;
            if !password_stdin {
                // The only time it is shown: the server keeps a hash.
                println!("{token}");
                eprintln!("user '{name}' set; give it SPINDLE_USER={name} and the token above as SPINDLE_TOKEN");
            }
        }
        UserCommand::Remove { name } => {
            client.acl("remove_user", vec![("name", name.as_str().into())])?;
        }
        UserCommand::List => {
            for user in client.acl("users", Vec::new())?.as_array().into_iter().flatten() {
                let name = field(user, "name").and_then(Value::as_str).unwrap_or("?");
                println!("{name}\t{}", joined(field(user, "roles")));
            }
        }
        UserCommand::Whoami => {
            let me = client.acl("whoami", Vec::new())?;
            println!("{}", field(&me, "user").and_then(Value::as_str).unwrap_or("?"));
        }
    }
    Ok(())
}

pub(crate) fn role(args: RoleArgs) -> Result<(), String> {
    let mut client = Client::connect(&args.address.address)?;
    match args.command {
        RoleCommand::Add { name, rules } => {
            let rules = Value::Array(rules.into_iter().map(Value::from).collect());
            client.acl("set_role", vec![("name", name.as_str().into()), ("rules", rules)])?;
        }
        RoleCommand::Remove { name } => {
            client.acl("remove_role", vec![("name", name.as_str().into())])?;
        }
        RoleCommand::List => {
            for role in client.acl("roles", Vec::new())?.as_array().into_iter().flatten() {
                let name = field(role, "name").and_then(Value::as_str).unwrap_or("?");
                let built_in = field(role, "built_in").and_then(Value::as_bool) == Some(true);
                let note = if built_in { "\t(built-in)" } else { "" };
                println!("{name}\t{}{note}", joined(field(role, "rules")));
            }
        }
    }
    Ok(())
}

fn joined(list: Option<&Value>) -> String {
    let items = list.and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    items.iter().filter_map(Value::as_str).collect::<Vec<_>>().join(" ")
}

fn read_password() -> Result<String, String> {
    let stdin = std::io::stdin();
    if stdin.is_terminal() {
        eprint!("password: ");
    }
    let mut line = String::new();
    stdin
        .lock()
        .read_line(&mut line)
        .map_err(|e| format!("cannot read the password: {e}"))?;
    let password = line.trim_end_matches(['\n', '\r']).to_string();
    match password.is_empty() {
        true => Err("no password on stdin".into()),
        false => Ok(password),
    }
}
