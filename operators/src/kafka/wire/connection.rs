//! One blocking connection to a broker: TCP or TLS, authenticated with SASL when the settings
//! ask for it (`SaslHandshake` v1, then `SaslAuthenticate` v2 rounds), then length-prefixed
//! request/response pairs.

use super::scram::Scram;
use super::security::{KafkaSecurity, Mechanism};
use bytes::{Buf, BufMut, BytesMut};
use kafka_protocol::messages::{
    ApiKey, RequestHeader, ResponseHeader, SaslAuthenticateRequest, SaslAuthenticateResponse,
    SaslHandshakeRequest, SaslHandshakeResponse,
};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, StrBytes};
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

const SASL_HANDSHAKE_VERSION: i16 = 1;
const SASL_AUTHENTICATE_VERSION: i16 = 2;

/// Why a connection or a call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum WireError {
    /// Network trouble: the broker may answer later.
    Unreachable(String),
    /// The broker or its certificate refused us (TLS, SASL): trying again will not help.
    Refused(String),
}

enum Stream {
    Plain(TcpStream),
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            Stream::Tls(s) => s.flush(),
        }
    }
}

/// A connection speaking length-prefixed Kafka requests.
pub(crate) struct Connection {
    stream: Stream,
    address: String,
    correlation_id: i32,
}

impl Connection {
    /// Connects to `address` (`host:port`) before `deadline`, with TLS and SASL as `security` says.
    pub(crate) fn open(
        address: &str,
        deadline: Instant,
        security: &KafkaSecurity,
    ) -> Result<Self, WireError> {
        let unreachable = |reason: String| WireError::Unreachable(format!("{address}: {reason}"));
        let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(100));
        let addr = address
            .to_socket_addrs()
            .map_err(|e| unreachable(e.to_string()))?
            .next()
            .ok_or_else(|| unreachable("no address".to_owned()))?;
        let tcp = TcpStream::connect_timeout(&addr, left).map_err(|e| unreachable(e.to_string()))?;
        tcp.set_read_timeout(Some(left)).map_err(|e| unreachable(e.to_string()))?;
        tcp.set_write_timeout(Some(left)).map_err(|e| unreachable(e.to_string()))?;
        tcp.set_nodelay(true).map_err(|e| unreachable(e.to_string()))?;
        let stream = match &security.tls {
            None => Stream::Plain(tcp),
            Some(config) => {
                let host = address
                    .rsplit_once(':')
                    .map_or(address, |(h, _)| h)
                    .trim_start_matches('[')
                    .trim_end_matches(']');
                let name = rustls::pki_types::ServerName::try_from(host.to_owned())
                    .map_err(|e| WireError::Refused(format!("{address}: not a TLS server name: {e}")))?;
                let tls = rustls::ClientConnection::new(config.clone(), name)
                    .map_err(|e| WireError::Refused(format!("{address}: TLS: {e}")))?;
                let mut stream = rustls::StreamOwned::new(tls, tcp);
                // The handshake now, so that a refused certificate is told apart from a lost network.
                while stream.conn.is_handshaking() {
                    stream.conn.complete_io(&mut stream.sock).map_err(|e| tls_error(address, e))?;
                }
                Stream::Tls(Box::new(stream))
            }
        };
        let mut conn = Connection { stream, address: address.to_owned(), correlation_id: 0 };
        if let Some(sasl) = &security.sasl {
            conn.authenticate(sasl.mechanism, &sasl.username, &sasl.password)?;
        }
        Ok(conn)
    }

    fn authenticate(
        &mut self,
        mechanism: Mechanism,
        username: &str,
        password: &str,
    ) -> Result<(), WireError> {
        let address = self.address.clone();
        let refused =
            |reason: String| WireError::Refused(format!("{address}: SASL {}: {reason}", mechanism.name()));
        let handshake =
            SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str(mechanism.name()));
        let answer: SaslHandshakeResponse =
            self.call(ApiKey::SaslHandshake, &handshake, SASL_HANDSHAKE_VERSION)?;
        if answer.error_code != 0 {
            let offered: Vec<&str> = answer.mechanisms.iter().map(|m| m.as_str()).collect();
            return Err(refused(format!("the broker does not offer it (it offers {offered:?})")));
        }
        match mechanism {
            Mechanism::Plain => {
                self.sasl_round(format!("\0{username}\0{password}").into_bytes(), mechanism)?;
            }
            Mechanism::Scram(hash) => {
                let (mut scram, first) = Scram::start(hash, username, password).map_err(&refused)?;
                let server_first = self.sasl_round(first, mechanism)?;
                let last = scram.answer(&server_first).map_err(&refused)?;
                let server_final = self.sasl_round(last, mechanism)?;
                scram.verify(&server_final).map_err(&refused)?;
            }
        }
        Ok(())
    }

    fn sasl_round(&mut self, bytes: Vec<u8>, mechanism: Mechanism) -> Result<Vec<u8>, WireError> {
        let request = SaslAuthenticateRequest::default().with_auth_bytes(bytes.into());
        let answer: SaslAuthenticateResponse =
            self.call(ApiKey::SaslAuthenticate, &request, SASL_AUTHENTICATE_VERSION)?;
        if answer.error_code != 0 {
            let message = answer.error_message.as_ref().map_or("", |m| m.as_str());
            return Err(WireError::Refused(format!(
                "{}: SASL {} authentication failed: {message} (error {})",
                self.address,
                mechanism.name(),
                answer.error_code
            )));
        }
        Ok(answer.auth_bytes.to_vec())
    }

    /// Sends `request` at `version` and reads its answer.
    pub(crate) fn call<Req, Resp>(
        &mut self,
        key: ApiKey,
        request: &Req,
        version: i16,
    ) -> Result<Resp, WireError>
    where
        Req: Encodable + HeaderVersion,
        Resp: Decodable + HeaderVersion,
    {
        self.correlation_id += 1;
        let address = self.address.clone();
        let broken =
            |reason: String| WireError::Unreachable(format!("{address}: {key:?} v{version}: {reason}"));
        let header = RequestHeader::default()
            .with_request_api_key(key as i16)
            .with_request_api_version(version)
            .with_correlation_id(self.correlation_id)
            .with_client_id(Some(StrBytes::from_static_str("caudal")));
        let mut body = BytesMut::new();
        header
            .encode(&mut body, Req::header_version(version))
            .and_then(|()| request.encode(&mut body, version))
            .map_err(|e| broken(format!("encoding: {e}")))?;
        let mut frame = BytesMut::with_capacity(body.len() + 4);
        frame.put_i32(i32::try_from(body.len()).unwrap_or(i32::MAX));
        frame.extend_from_slice(&body);
        self.stream
            .write_all(&frame)
            .and_then(|()| self.stream.flush())
            .map_err(|e| broken(e.to_string()))?;

        let mut len = [0u8; 4];
        self.stream.read_exact(&mut len).map_err(|e| broken(e.to_string()))?;
        let len = usize::try_from(i32::from_be_bytes(len)).unwrap_or(0);
        let mut answer = vec![0u8; len];
        self.stream.read_exact(&mut answer).map_err(|e| broken(e.to_string()))?;
        let mut buf = bytes::Bytes::from(answer);
        let header = ResponseHeader::decode(&mut buf, Resp::header_version(version))
            .map_err(|e| broken(format!("decoding the header: {e}")))?;
        if header.correlation_id != self.correlation_id {
            return Err(broken(format!(
                "answer to request {} while waiting for {}",
                header.correlation_id, self.correlation_id
            )));
        }
        let response = Resp::decode(&mut buf, version).map_err(|e| broken(format!("decoding: {e}")))?;
        if buf.has_remaining() {
            return Err(broken(format!("{} bytes left over", buf.remaining())));
        }
        Ok(response)
    }
}

/// A TLS failure: a certificate the settings do not trust is a refusal; the rest is network.
fn tls_error(address: &str, e: std::io::Error) -> WireError {
    let refusal = e.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>()).is_some()
        || e.kind() == std::io::ErrorKind::InvalidData;
    if refusal {
        WireError::Refused(format!("{address}: TLS handshake: {e}"))
    } else {
        WireError::Unreachable(format!("{address}: TLS handshake: {e}"))
    }
}
