//! The NATS JetStream sink (`nats`): each record published to the sink's subject with header
//! `Nats-Msg-Id` = its stream key, so JetStream drops a record sent again within the stream's
//! duplicate window, and `Sluice-Batch-Id` = the batch id. A batch is acknowledged when
//! JetStream answered a PubAck for every record.
//!
//! The client is a small one of our own over the NATS text protocol (`INFO`, `CONNECT`,
//! `PING`/`PONG`, `HPUB` with headers, `SUB` to a reply inbox, `MSG`/`HMSG`): publishing with
//! acknowledgements is all a sink needs, and the `async-nats` crate would add a second TLS
//! stack (rustls with ring) and ~40 crates to a build whose bottleneck is compile time.
//! TLS (`tls: true`, or a server that requires it) goes through OpenSSL (`native-tls`), which
//! the build has already. Authentication: user and password, or a token.
//!
//! Publishes are pipelined: every record of the batch is written, then the acks are read
//! (up to [`ACK_TIMEOUT`]). Errors:
//! - no connection, a broken one, no responders (no stream captures the subject: `503`), a
//!   timeout, a JetStream error such as a full stream: retried (the source is held);
//! - a record larger than the server's `max_payload`, or one JetStream refuses as too large
//!   for the stream (`err_code` 10054): that record is rejected (dead-lettered) alone.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{Value, json};
use sluice_core::pipeline::NatsSinkConfig;
use sluice_core::secret::SecretValue;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufStream};
use tokio::sync::Mutex;

use super::external::{Batch, Sent, Transport, TransportError};

/// How long a batch waits for its acknowledgements, and a connection for the server.
pub const ACK_TIMEOUT: Duration = Duration::from_secs(10);
/// JetStream's error code for a message over the stream's `max_msg_size`.
const JS_MESSAGE_TOO_LARGE: u64 = 10054;

/// How the sink logs in.
#[derive(Debug, Clone)]
pub enum NatsAuth {
    None,
    Token(SecretValue),
    UserPassword { user: String, password: SecretValue },
}

/// Publishes to a NATS JetStream subject.
#[derive(Debug)]
pub struct NatsTransport {
    servers: Vec<String>,
    subject: String,
    auth: NatsAuth,
    tls: bool,
    connection: Mutex<Option<Connection>>,
}

impl NatsTransport {
    /// A transport for `config`; it connects at the first send.
    pub fn new(config: &NatsSinkConfig, auth: NatsAuth) -> Self {
        let servers = config.url.split(',').map(|url| url.trim().to_owned()).collect();
        Self {
            servers,
            subject: config.subject.clone(),
            auth,
            tls: config.tls,
            connection: Mutex::new(None),
        }
    }

    async fn connect(&self) -> Result<Connection, TransportError> {
        let mut last = TransportError::retryable("no NATS server URL");
        for server in &self.servers {
            match Connection::open(server, &self.auth, self.tls).await {
                Ok(connection) => return Ok(connection),
                Err(error) => last = error,
            }
        }
        Err(last)
    }
}

#[async_trait::async_trait]
impl Transport for NatsTransport {
    async fn send(&self, batch: Batch<'_>) -> Result<Sent, TransportError> {
        let mut slot = self.connection.lock().await;
        let connection = match slot.as_mut() {
            Some(connection) => connection,
            None => slot.insert(self.connect().await?),
        };
        let sent = connection.publish_all(&self.subject, batch).await;
        if matches!(sent, Err(TransportError::Retryable { .. })) {
            // A broken or confused connection is not used again.
            *slot = None;
        }
        sent
    }

    fn connection(&self) -> Value {
        json!({
            "transport": "nats",
            "url": self.servers.join(","),
            "subject": self.subject,
            "tls": self.tls,
        })
    }

    async fn close(&self) {
        if let Some(mut connection) = self.connection.lock().await.take() {
            let _ = connection.stream.shutdown().await;
        }
    }
}

trait Io: AsyncRead + AsyncWrite + Unpin + Send + std::fmt::Debug {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + std::fmt::Debug> Io for T {}

/// One connection to a server, with its reply inbox.
#[derive(Debug)]
pub struct Connection {
    stream: BufStream<Box<dyn Io>>,
    inbox: String,
    max_payload: usize,
    next_reply: u64,
}

/// A message delivered to the inbox.
#[derive(Debug)]
struct Reply {
    subject: String,
    /// The status line of the headers (`NATS/1.0 503` for no responders), if any.
    status: Option<String>,
    payload: Vec<u8>,
}

fn broken(what: impl std::fmt::Display) -> TransportError {
    TransportError::retryable(format!("NATS connection: {what}"))
}

impl Connection {
    /// Connects to `url` (`nats://host:port` or `tls://host:port`) and logs in.
    ///
    /// # Errors
    /// [`TransportError::Retryable`] when the server cannot be reached or refuses the login.
    pub async fn open(url: &str, auth: &NatsAuth, tls: bool) -> Result<Self, TransportError> {
        let parsed = url::Url::parse(url).map_err(|_| broken("the URL does not parse"))?;
        let host = parsed.host_str().ok_or_else(|| broken("the URL has no host"))?.to_owned();
        let port = parsed.port().unwrap_or(4222);
        let tls = tls || parsed.scheme() == "tls";
        let tcp = tokio::time::timeout(
            ACK_TIMEOUT,
            tokio::net::TcpStream::connect((host.as_str(), port)),
        )
        .await
        .map_err(|_| broken(format!("connecting to {host}:{port} timed out")))?
        .map_err(|error| broken(format!("cannot connect to {host}:{port}: {}", error.kind())))?;
        tcp.set_nodelay(true).map_err(|error| broken(error.kind()))?;
        let mut plain = BufStream::new(tcp);
        let info = read_info(&mut plain).await?;
        let max_payload = info["max_payload"].as_u64().map_or(1 << 20, |n| n as usize);
        let stream: Box<dyn Io> = if tls || info["tls_required"] == true {
            let connector = native_tls::TlsConnector::new().map_err(broken)?;
            let connector = tokio_native_tls::TlsConnector::from(connector);
            let tls_stream = connector
                .connect(&host, plain.into_inner())
                .await
                .map_err(|error| broken(format!("TLS: {error}")))?;
            Box::new(tls_stream)
        } else {
            Box::new(plain.into_inner())
        };
        let mut connect = json!({
            "verbose": false, "pedantic": false, "headers": true, "no_responders": true,
            "lang": "rust", "name": "sluice-sink", "version": env!("CARGO_PKG_VERSION"),
            "protocol": 1, "tls_required": tls,
        });
        match auth {
            NatsAuth::None => {}
            NatsAuth::Token(token) => connect["auth_token"] = json!(token.expose()),
            NatsAuth::UserPassword { user, password } => {
                connect["user"] = json!(user);
                connect["pass"] = json!(password.expose());
            }
        }
        let mut suffix = [0u8; 8];
        getrandom::fill(&mut suffix).map_err(|_| broken("no system randomness"))?;
        let inbox = format!(
            "_INBOX.sluice.{}",
            suffix.iter().map(|b| format!("{b:02x}")).collect::<String>()
        );
        let mut connection =
            Self { stream: BufStream::new(stream), inbox, max_payload, next_reply: 0 };
        let hello = format!("CONNECT {connect}\r\nPING\r\nSUB {}.* 1\r\n", connection.inbox);
        connection.write(hello.as_bytes()).await?;
        // The server answers PONG once it accepted CONNECT, or -ERR (a refused login).
        tokio::time::timeout(ACK_TIMEOUT, connection.until_pong())
            .await
            .map_err(|_| broken("the server did not answer the login"))??;
        Ok(connection)
    }

    async fn write(&mut self, bytes: &[u8]) -> Result<(), TransportError> {
        self.stream.write_all(bytes).await.map_err(|error| broken(error.kind()))?;
        self.stream.flush().await.map_err(|error| broken(error.kind()))
    }

    async fn until_pong(&mut self) -> Result<(), TransportError> {
        loop {
            match self.next_message().await? {
                Incoming::Pong => return Ok(()),
                Incoming::Reply(_) | Incoming::Other => {}
            }
        }
    }

    /// Reads the next protocol message, answering the server's PINGs.
    async fn next_message(&mut self) -> Result<Incoming, TransportError> {
        let mut line = String::new();
        let read = self.stream.read_line(&mut line).await.map_err(|error| broken(error.kind()))?;
        if read == 0 {
            return Err(broken("closed by the server"));
        }
        let line = line.trim_end();
        let mut words = line.split_ascii_whitespace();
        match words.next().unwrap_or_default() {
            "PING" => {
                self.write(b"PONG\r\n").await?;
                Ok(Incoming::Other)
            }
            "PONG" => Ok(Incoming::Pong),
            "+OK" | "INFO" => Ok(Incoming::Other),
            "-ERR" => Err(broken(format!("server error {}", line.trim_start_matches("-ERR ")))),
            "MSG" => {
                // MSG <subject> <sid> [reply-to] <#bytes>
                let parts: Vec<&str> = words.collect();
                let subject = parts.first().copied().unwrap_or_default().to_owned();
                let size: usize =
                    parts.last().and_then(|n| n.parse().ok()).ok_or_else(|| broken("bad MSG"))?;
                let payload = self.read_payload(size).await?;
                Ok(Incoming::Reply(Reply { subject, status: None, payload }))
            }
            "HMSG" => {
                // HMSG <subject> <sid> [reply-to] <#header bytes> <#total bytes>
                let parts: Vec<&str> = words.collect();
                let subject = parts.first().copied().unwrap_or_default().to_owned();
                let numbers: Vec<usize> =
                    parts.iter().rev().take(2).filter_map(|n| n.parse().ok()).collect();
                let [total, header] = numbers[..] else { return Err(broken("bad HMSG")) };
                let mut data = self.read_payload(total).await?;
                let payload = data.split_off(header.min(data.len()));
                let headers = String::from_utf8_lossy(&data);
                let status = headers.lines().next().map(str::to_owned);
                Ok(Incoming::Reply(Reply { subject, status, payload }))
            }
            _ => Ok(Incoming::Other),
        }
    }

    async fn read_payload(&mut self, size: usize) -> Result<Vec<u8>, TransportError> {
        let mut data = vec![0; size + 2];
        self.stream.read_exact(&mut data).await.map_err(|error| broken(error.kind()))?;
        data.truncate(size);
        Ok(data)
    }

    /// Publishes every record and reads their acknowledgements.
    async fn publish_all(
        &mut self,
        subject: &str,
        batch: Batch<'_>,
    ) -> Result<Sent, TransportError> {
        let mut sent = Sent::default();
        let mut waiting: HashMap<String, usize> = HashMap::with_capacity(batch.records.len());
        let mut out = Vec::with_capacity(batch.records.iter().map(|r| r.value.len() + 160).sum());
        for (index, record) in batch.records.iter().enumerate() {
            let id = message_id(&record.key);
            let headers =
                format!("NATS/1.0\r\nNats-Msg-Id: {id}\r\nSluice-Batch-Id: {}\r\n\r\n", batch.id);
            let total = headers.len() + record.value.len();
            if total > self.max_payload {
                sent.rejected.push((
                    index,
                    format!("the record ({total} bytes with headers) is over the server's max_payload of {} bytes", self.max_payload),
                ));
                continue;
            }
            self.next_reply += 1;
            let reply = format!("{}.{}", self.inbox, self.next_reply);
            out.extend_from_slice(
                format!("HPUB {subject} {reply} {} {total}\r\n", headers.len()).as_bytes(),
            );
            out.extend_from_slice(headers.as_bytes());
            out.extend_from_slice(&record.value);
            out.extend_from_slice(b"\r\n");
            waiting.insert(reply, index);
        }
        self.write(&out).await?;
        let deadline = tokio::time::Instant::now() + ACK_TIMEOUT;
        let mut failure = None;
        while !waiting.is_empty() {
            let incoming =
                tokio::time::timeout_at(deadline, self.next_message()).await.map_err(|_| {
                    broken(format!(
                        "{} of {} acknowledgements did not come in time",
                        waiting.len(),
                        batch.records.len()
                    ))
                })??;
            let Incoming::Reply(reply) = incoming else { continue };
            let Some(index) = waiting.remove(&reply.subject) else { continue };
            if let Some(status) = reply.status.as_deref().filter(|s| s.contains(" 503")) {
                let _ = status;
                failure.get_or_insert_with(|| {
                    format!("no JetStream stream captures subject '{subject}' (no responders)")
                });
                continue;
            }
            let ack: Value = serde_json::from_slice(&reply.payload).unwrap_or(Value::Null);
            if let Some(error) = ack.get("error") {
                let description = error["description"].as_str().unwrap_or("unknown error");
                if error["err_code"].as_u64() == Some(JS_MESSAGE_TOO_LARGE) {
                    sent.rejected
                        .push((index, format!("JetStream refused the record: {description}")));
                } else {
                    failure.get_or_insert_with(|| {
                        format!("JetStream refused a record: {description}")
                    });
                }
            } else if ack.get("stream").is_none() {
                failure.get_or_insert_with(|| "an acknowledgement that is not a PubAck".to_owned());
            }
        }
        match failure {
            Some(message) => Err(TransportError::Retryable { message, retry_after: None }),
            None => Ok(sent),
        }
    }

    /// Sends a request and waits for its answer (for JetStream API calls).
    ///
    /// # Errors
    /// A broken connection, a timeout, or no responders.
    pub async fn request(
        &mut self,
        subject: &str,
        payload: &[u8],
    ) -> Result<Vec<u8>, TransportError> {
        self.next_reply += 1;
        let reply = format!("{}.{}", self.inbox, self.next_reply);
        let mut out = format!("PUB {subject} {reply} {}\r\n", payload.len()).into_bytes();
        out.extend_from_slice(payload);
        out.extend_from_slice(b"\r\n");
        self.write(&out).await?;
        let deadline = tokio::time::Instant::now() + ACK_TIMEOUT;
        loop {
            let incoming = tokio::time::timeout_at(deadline, self.next_message())
                .await
                .map_err(|_| broken("no answer in time"))??;
            if let Incoming::Reply(answer) = incoming {
                if answer.subject == reply {
                    if answer.status.as_deref().is_some_and(|s| s.contains(" 503")) {
                        return Err(broken("no responders"));
                    }
                    return Ok(answer.payload);
                }
            }
        }
    }
}

enum Incoming {
    Pong,
    Reply(Reply),
    Other,
}

async fn read_info<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut BufStream<S>,
) -> Result<Value, TransportError> {
    let mut line = String::new();
    tokio::time::timeout(ACK_TIMEOUT, stream.read_line(&mut line))
        .await
        .map_err(|_| broken("the server sent no INFO"))?
        .map_err(|error| broken(error.kind()))?;
    let info =
        line.strip_prefix("INFO ").ok_or_else(|| broken("the server did not start with INFO"))?;
    serde_json::from_str(info.trim()).map_err(|_| broken("an INFO that is not JSON"))
}

/// The `Nats-Msg-Id` of a key: the key when it is printable ASCII, else its hex.
fn message_id(key: &[u8]) -> String {
    if !key.is_empty() && key.iter().all(|b| b.is_ascii_graphic()) {
        String::from_utf8_lossy(key).into_owned()
    } else {
        key.iter().map(|b| format!("{b:02x}")).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_ids_are_printable_keys_or_their_hex() {
        assert_eq!(message_id(b"0xab:7"), "0xab:7");
        assert_eq!(message_id(b"a b"), "612062");
        assert_eq!(message_id(b"x\r\nInjected: 1"), "780d0a496e6a65637465643a2031");
    }
}
