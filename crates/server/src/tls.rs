//! TLS with rustls: the listening port's acceptor (server certificate, and client
//! certificates when `--tls-client-ca` asks for them), the client side a node uses toward
//! its peers (its own certificate as the client's), and the readable refusal of a client
//! that speaks plaintext to a TLS port.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use spindle_core::{Error, ErrorKind};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::{TlsAcceptor, TlsConnector};

use crate::config::{TlsConfig, MISSING_CA};
use crate::Shared;

/// A client that connects and neither finishes its handshake nor closes is dropped after
/// this, so it holds nothing for long.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a plaintext client's bytes are swallowed after its error reply, so that closing
/// with unread input does not reset the connection before the client reads the reply.
const LINGER: Duration = Duration::from_secs(1);
/// The first byte of every TLS connection: a handshake record.
const HANDSHAKE_RECORD: u8 = 0x16;

/// The answer to a plaintext client on a TLS port.
pub const PLAINTEXT_REFUSED: &str = "this port speaks TLS: connect with TLS (spindle: --tls-ca / SPINDLE_TLS_CA)";

/// Any byte stream a connection or a peer link runs over: a socket, or TLS over one.
pub(crate) trait Stream: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Stream for T {}

/// A server's TLS settings, loaded.
pub(crate) struct Tls {
    acceptor: TlsAcceptor,
    /// How this node connects to its peers (and how a joining node asks its seed).
    connector: TlsConnector,
    /// What the server's workers and object hosts connect back with.
    pub(crate) children: ChildFiles,
}

/// The files a worker or object host is told of (`SPINDLE_TLS_CA`, `SPINDLE_TLS_CERT`,
/// `SPINDLE_TLS_KEY`).
pub(crate) struct ChildFiles {
    pub(crate) ca: PathBuf,
    /// The server's own certificate and key, when the port wants client certificates.
    pub(crate) identity: Option<(PathBuf, PathBuf)>,
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl Tls {
    /// Read the certificates and key `config` names; an error says which file is wrong.
    pub(crate) fn load(config: &TlsConfig) -> io::Result<Tls> {
        let server = server_config(config)?;
        let ca = config.trusted_ca().ok_or_else(|| io::Error::other(MISSING_CA))?;
        // Peers present this node's certificate: nodes with --tls-client-ca need one.
        let client = client_config(ca, Some((&config.cert, &config.key)))?;
        Ok(Tls {
            acceptor: TlsAcceptor::from(Arc::new(server)),
            connector: TlsConnector::from(Arc::new(client)),
            children: ChildFiles {
                ca: ca.to_path_buf(),
                identity: config
                    .client_ca
                    .as_ref()
                    .map(|_| (config.cert.clone(), config.key.clone())),
            },
        })
    }

    /// Connect TLS over `stream` to the node at `address` (whose certificate must name its host).
    pub(crate) async fn connect(&self, address: &str, stream: TcpStream) -> io::Result<Box<dyn Stream>> {
        let host = address
            .rsplit_once(':')
            .map_or(address, |(host, _)| host)
            .trim_start_matches('[')
            .trim_end_matches(']');
        let name = ServerName::try_from(host.to_string())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{host}: {e}")))?;
        let stream = tokio::time::timeout(HANDSHAKE_TIMEOUT, self.connector.connect(name, stream))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no TLS handshake within 10 s"))??;
        Ok(Box::new(stream))
    }
}

/// The listening side: the server's certificate, and the client CA's verifier with one.
pub fn server_config(config: &TlsConfig) -> io::Result<ServerConfig> {
    let provider = provider();
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(io::Error::other)?;
    let builder = match &config.client_ca {
        Some(path) => {
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots(path)?), provider)
                .build()
                .map_err(|e| io::Error::other(format!("--tls-client-ca {}: {e}", path.display())))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    builder
        .with_single_cert(certificates(&config.cert)?, private_key(&config.key)?)
        .map_err(|e| io::Error::other(format!("--tls-cert and --tls-key do not go together: {e}")))
}

/// A connection to a TLS port: the handshake, within [`HANDSHAKE_TIMEOUT`]. `None` when it
/// failed (logged as a refusal), when the client closed first, or when it spoke plaintext
/// (answered with one error frame, then closed).
pub(crate) async fn accept(
    shared: &Shared,
    tls: &Tls,
    stream: TcpStream,
    peer: SocketAddr,
) -> Option<tokio_rustls::server::TlsStream<TcpStream>> {
    let mut first = [0u8; 1];
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, stream.peek(&mut first)).await {
        Ok(Ok(1..)) if first[0] == HANDSHAKE_RECORD => {}
        Ok(Ok(1..)) => {
            shared
                .audit
                .refused(peer.ip(), "plaintext on the TLS port (told to connect with TLS)");
            let _ = tokio::time::timeout(2 * LINGER, refuse_plaintext(stream)).await;
            return None;
        }
        // Closed before a byte (a check that the port listens), failed, or silent.
        _ => return None,
    }
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.acceptor.accept(stream)).await {
        Ok(Ok(stream)) => Some(stream),
        Ok(Err(e)) => {
            shared.audit.refused(peer.ip(), &format!("TLS handshake failed: {e}"));
            None
        }
        Err(_) => {
            shared.audit.refused(peer.ip(), "no TLS handshake within 10 s");
            None
        }
    }
}

/// One error frame in plaintext (request id 0, as for a frame that could not be read),
/// then the end of the connection.
async fn refuse_plaintext(mut stream: TcpStream) {
    let mut reply = Vec::new();
    let error = Error::new(ErrorKind::ProtocolError, PLAINTEXT_REFUSED);
    spindle_proto::encode_reply(0, &Err(error), &mut reply);
    if stream.write_all(&reply).await.is_err() || stream.shutdown().await.is_err() {
        return;
    }
    let mut sink = [0u8; 4096];
    let _ = tokio::time::timeout(LINGER, async { while let Ok(1..) = stream.read(&mut sink).await {} }).await;
}

fn unreadable(path: &Path, what: &str, e: impl std::fmt::Display) -> io::Error {
    io::Error::other(format!("cannot read {what} from {}: {e}", path.display()))
}

/// The certificates of a PEM file, leaf first.
pub fn certificates(path: &Path) -> io::Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| unreadable(path, "certificates", e))?;
    if certs.is_empty() {
        return Err(unreadable(path, "certificates", "no CERTIFICATE in the file"));
    }
    Ok(certs)
}

/// The private key of a PEM file.
pub fn private_key(path: &Path) -> io::Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| unreadable(path, "a private key", e))
}

/// The CA certificates of a PEM file, as trust anchors.
pub fn roots(path: &Path) -> io::Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    for cert in certificates(path)? {
        roots.add(cert).map_err(|e| unreadable(path, "a CA certificate", e))?;
    }
    Ok(roots)
}

/// A client's TLS settings (the `spindle` command's own connections): trust `ca`, and
/// present `identity` (certificate and key files) when given.
pub fn client_config(ca: &Path, identity: Option<(&Path, &Path)>) -> io::Result<ClientConfig> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(io::Error::other)?
        .with_root_certificates(roots(ca)?);
    match identity {
        Some((cert, key)) => builder
            .with_client_auth_cert(certificates(cert)?, private_key(key)?)
            .map_err(|e| {
                io::Error::other(format!(
                    "{} and {} do not go together: {e}",
                    cert.display(),
                    key.display()
                ))
            }),
        None => Ok(builder.with_no_client_auth()),
    }
}
