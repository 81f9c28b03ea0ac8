//! `spindle cert`: a development CA and the certificates a TLS server, its peers and its
//! clients use (rcgen). For production, certificates come from the site's own CA.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use clap::Args;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose, SanType,
};

#[derive(Args)]
pub(crate) struct CertArgs {
    /// Directory to write into (created if missing). Existing files are not overwritten.
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// Another name the server is reached at (a host name or an IP address), besides
    /// localhost, 127.0.0.1 and ::1 (repeatable).
    #[arg(long = "name", value_name = "HOST")]
    names: Vec<String>,
}

/// The files written, in order: certificates, then keys (0600).
const FILES: [&str; 6] = [
    "ca.pem",
    "server.pem",
    "client.pem",
    "ca-key.pem",
    "server-key.pem",
    "client-key.pem",
];

pub(crate) fn run(args: CertArgs) -> Result<(), String> {
    let (certs, keys) = generate(&args.names)?;
    fs::create_dir_all(&args.out).map_err(|e| format!("cannot create {}: {e}", args.out.display()))?;
    // All or nothing: refuse before writing anything if a file is there.
    if let Some(existing) = FILES.iter().map(|f| args.out.join(f)).find(|p| p.exists()) {
        return Err(format!(
            "{} exists: not overwriting certificates or keys (choose another --out)",
            existing.display()
        ));
    }
    for (name, pem) in FILES.iter().zip(certs.iter().chain(keys.iter())) {
        let mode = if name.ends_with("-key.pem") { 0o600 } else { 0o644 };
        write_new(&args.out.join(name), pem, mode)?;
    }
    println!(
        "wrote {}: ca.pem (the development CA), server.pem and server-key.pem (for spindle server \
         --tls-cert/--tls-key; also a node's client certificate), client.pem and client-key.pem \
         (a client certificate, for servers with --tls-client-ca)",
        args.out.display()
    );
    println!(
        "  spindle server --tls-cert {0}/server.pem --tls-key {0}/server-key.pem --tls-ca {0}/ca.pem",
        args.out.display()
    );
    println!("  export SPINDLE_TLS_CA={}/ca.pem", args.out.display());
    Ok(())
}

/// A CA, a server certificate (for `localhost`, 127.0.0.1, ::1 and `names`; usable as a
/// node's client certificate too) and a client certificate, all signed by the CA: their
/// PEMs `[ca, server, client]` and their keys' in the same order.
pub(crate) fn generate(names: &[String]) -> Result<([String; 3], [String; 3]), String> {
    let failed = |what: &str, e: rcgen::Error| format!("cannot make the {what}: {e}");
    let key = || KeyPair::generate().map_err(|e| failed("keys", e));

    let mut ca = CertificateParams::default();
    ca.distinguished_name = name("Spindle development CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_key = key()?;
    let ca_cert = ca.self_signed(&ca_key).map_err(|e| failed("CA", e))?;

    let mut hosts = vec!["localhost".to_string(), "127.0.0.1".into(), "::1".into()];
    hosts.extend(names.iter().filter(|n| !hosts.contains(n)).cloned().collect::<Vec<_>>());
    let mut server = CertificateParams::new(Vec::<String>::new()).map_err(|e| failed("server certificate", e))?;
    for host in &hosts {
        server.subject_alt_names.push(match host.parse() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => SanType::DnsName(
                host.clone()
                    .try_into()
                    .map_err(|e| format!("--name {host}: not a host name: {e}"))?,
            ),
        });
    }
    server.distinguished_name = name("spindle server");
    // Nodes present their own certificate to each other, as clients.
    server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
    let server_key = key()?;
    let server_cert = server
        .signed_by(&server_key, &ca_cert, &ca_key)
        .map_err(|e| failed("server certificate", e))?;

    let mut client = CertificateParams::default();
    client.distinguished_name = name("spindle client");
    client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let client_key = key()?;
    let client_cert = client
        .signed_by(&client_key, &ca_cert, &ca_key)
        .map_err(|e| failed("client certificate", e))?;

    Ok((
        [ca_cert.pem(), server_cert.pem(), client_cert.pem()],
        [
            ca_key.serialize_pem(),
            server_key.serialize_pem(),
            client_key.serialize_pem(),
        ],
    ))
}

fn name(common: &str) -> DistinguishedName {
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, common);
    name
}

/// Write a file that must not exist yet, with `mode` from its creation (a key is never
/// readable by others, not even for a moment).
fn write_new(path: &Path, contents: &str, mode: u32) -> Result<(), String> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .and_then(|mut file| file.write_all(contents.as_bytes()))
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;
    use std::sync::Arc;

    /// The certificates work for what they are made for: a rustls server with the server's
    /// and a client that trusts the CA and presents the client's, over a real socket, with
    /// mutual TLS; a client without a certificate is refused.
    #[test]
    fn the_certificates_make_a_mutual_tls_connection() {
        let dir = std::env::temp_dir().join(format!("spindle-cert-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        run(CertArgs {
            out: dir.clone(),
            names: vec!["spindle.example".into(), "10.1.2.3".into()],
        })
        .unwrap();
        for key in ["ca-key.pem", "server-key.pem", "client-key.pem"] {
            let mode = fs::metadata(dir.join(key)).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "{key}");
        }
        let again = run(CertArgs {
            out: dir.clone(),
            names: vec![],
        });
        assert!(again.unwrap_err().contains("exists"), "never overwrites keys");

        let server_config = spindle_server::config::TlsConfig {
            cert: dir.join("server.pem"),
            key: dir.join("server-key.pem"),
            client_ca: Some(dir.join("ca.pem")),
            ca: None,
        };
        let ca = dir.join("ca.pem");
        let with_cert =
            spindle_server::tls::client_config(&ca, Some((&dir.join("client.pem"), &dir.join("client-key.pem"))));
        let without = spindle_server::tls::client_config(&ca, None);
        for host in ["localhost", "127.0.0.1", "::1", "spindle.example", "10.1.2.3"] {
            assert!(
                handshake(&server_config, with_cert.as_ref().unwrap(), host).is_ok(),
                "{host}"
            );
        }
        assert!(handshake(&server_config, with_cert.as_ref().unwrap(), "other.example").is_err());
        let refused = handshake(&server_config, without.as_ref().unwrap(), "localhost");
        assert!(refused.is_err(), "a client without a certificate got in");
        fs::remove_dir_all(&dir).unwrap();
    }

    /// A handshake over a socket pair (in memory) and one byte each way.
    fn handshake(
        server: &spindle_server::config::TlsConfig,
        client: &rustls::ClientConfig,
        host: &str,
    ) -> Result<(), String> {
        use std::io::{Read, Write};
        let acceptor = spindle_server::tls::server_config(server).map_err(|e| e.to_string())?;
        let (mut a, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
        let serving = std::thread::spawn(move || {
            let mut conn = rustls::ServerConnection::new(Arc::new(acceptor)).map_err(|e| e.to_string())?;
            let mut stream = rustls::Stream::new(&mut conn, &mut a);
            let mut byte = [0u8];
            stream.read_exact(&mut byte).map_err(|e| e.to_string())?;
            stream.write_all(&byte).map_err(|e| e.to_string())
        });
        let name = rustls::pki_types::ServerName::try_from(host.to_string()).unwrap();
        let mut conn = rustls::ClientConnection::new(Arc::new(client.clone()), name).unwrap();
        let outcome = {
            let mut stream = rustls::Stream::new(&mut conn, &mut b);
            let mut byte = [7u8];
            stream
                .write_all(&byte)
                .and_then(|()| stream.read_exact(&mut byte))
                .map_err(|e| e.to_string())
        };
        // The server's read ends now, whatever the handshake did.
        drop(b);
        let served = serving.join().unwrap();
        outcome.and(served)
    }
}
