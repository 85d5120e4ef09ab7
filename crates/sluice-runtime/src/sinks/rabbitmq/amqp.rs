//! The part of AMQP 0.9.1 a publishing sink needs: the connection handshake (PLAIN login),
//! one channel in confirm mode, `exchange.declare` (passive: does it exist?),
//! `basic.publish` with content header and body frames, and the broker's `basic.ack` /
//! `basic.nack` confirms; `channel.close` and `connection.close` from the broker become
//! errors. Frames and field types as the AMQP 0.9.1 specification lays them out.

use std::collections::BTreeSet;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufStream};

const FRAME_METHOD: u8 = 1;
const FRAME_HEADER: u8 = 2;
const FRAME_BODY: u8 = 3;
const FRAME_HEARTBEAT: u8 = 8;
const FRAME_END: u8 = 0xCE;
/// The one channel the sink publishes on.
const CHANNEL: u16 = 1;

pub trait Io: AsyncRead + AsyncWrite + Unpin + Send + std::fmt::Debug {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + std::fmt::Debug> Io for T {}

/// A failure of the connection or a refusal by the broker (`code` is its reply code, 0 when
/// the connection itself failed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AmqpError {
    pub code: u16,
    pub text: String,
}

impl std::fmt::Display for AmqpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.code == 0 {
            f.write_str(&self.text)
        } else {
            write!(f, "{} {}", self.code, self.text)
        }
    }
}

fn broken(what: impl std::fmt::Display) -> AmqpError {
    AmqpError { code: 0, text: format!("AMQP connection: {what}") }
}

/// Builds a method frame's arguments.
#[derive(Default)]
pub struct Args(Vec<u8>);

impl Args {
    fn u8(mut self, v: u8) -> Self {
        self.0.push(v);
        self
    }
    fn u16(mut self, v: u16) -> Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    fn u32(mut self, v: u32) -> Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    fn short(mut self, text: &str) -> Self {
        let bytes = &text.as_bytes()[..text.len().min(255)];
        self.0.push(bytes.len() as u8);
        self.0.extend_from_slice(bytes);
        self
    }
    fn long(mut self, bytes: &[u8]) -> Self {
        self.0.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
        self.0.extend_from_slice(bytes);
        self
    }
    /// A field table of string values (`S`), and nested tables of booleans (`F` of `t`).
    fn table(self, strings: &[(&str, &str)], flags: &[(&str, &[&str])]) -> Self {
        let mut body = Args::default();
        for (name, value) in strings {
            body = body.short(name).u8(b'S').long(value.as_bytes());
        }
        for (name, set) in flags {
            let mut inner = Args::default();
            for flag in *set {
                inner = inner.short(flag).u8(b't').u8(1);
            }
            body = body.short(name).u8(b'F').long(&inner.0);
        }
        self.long(&body.0)
    }
}

/// Reads a method frame's arguments.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], AmqpError> {
        if self.0.len() < n {
            return Err(broken("a frame ends early"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8, AmqpError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, AmqpError> {
        Ok(u16::from_be_bytes(self.take(2)?.try_into().expect("two bytes")))
    }
    fn u32(&mut self) -> Result<u32, AmqpError> {
        Ok(u32::from_be_bytes(self.take(4)?.try_into().expect("four bytes")))
    }
    fn u64(&mut self) -> Result<u64, AmqpError> {
        Ok(u64::from_be_bytes(self.take(8)?.try_into().expect("eight bytes")))
    }
    fn short(&mut self) -> Result<String, AmqpError> {
        let n = self.u8()? as usize;
        Ok(String::from_utf8_lossy(self.take(n)?).into_owned())
    }
    fn long(&mut self) -> Result<Vec<u8>, AmqpError> {
        let n = self.u32()? as usize;
        Ok(self.take(n)?.to_vec())
    }
}

/// One frame from the broker.
struct Frame {
    kind: u8,
    channel: u16,
    payload: Vec<u8>,
}

/// What a method frame from the broker is.
enum Method {
    /// `(class, method)` and its arguments.
    Other(u16, u16, Vec<u8>),
    Ack {
        tag: u64,
        multiple: bool,
    },
    /// The broker could not take a message (its tag, or all up to it).
    Nack,
    ChannelClose(AmqpError),
    ConnectionClose(AmqpError),
}

/// A message to publish.
pub struct Message<'a> {
    pub routing_key: &'a str,
    pub message_id: &'a str,
    pub batch_id: &'a str,
    pub body: &'a [u8],
}

/// A connection with one channel in confirm mode.
#[derive(Debug)]
pub struct Connection {
    stream: BufStream<Box<dyn Io>>,
    frame_max: usize,
    /// The delivery tag of the next publish.
    next_tag: u64,
}

/// Login and place.
pub struct Login<'a> {
    pub user: &'a str,
    pub password: &'a str,
    pub vhost: &'a str,
}

impl Connection {
    /// Opens the connection over `io`: handshake, login, vhost, channel 1, confirm mode.
    ///
    /// # Errors
    /// [`AmqpError`]: a refused login (403), an unknown vhost, a broken connection.
    pub async fn open(io: Box<dyn Io>, login: &Login<'_>) -> Result<Self, AmqpError> {
        let mut connection = Self { stream: BufStream::new(io), frame_max: 131_072, next_tag: 1 };
        connection.write_raw(b"AMQP\x00\x00\x09\x01").await?;
        connection.expect(0, 10, 10).await?; // connection.start
        let response = format!("\0{}\0{}", login.user, login.password);
        let start_ok = Args::default()
            .table(
                &[("product", "sluice"), ("version", env!("CARGO_PKG_VERSION"))],
                &[(
                    "capabilities",
                    &["publisher_confirms", "basic.nack", "authentication_failure_close"],
                )],
            )
            .short("PLAIN")
            .long(response.as_bytes())
            .short("en_US");
        connection.method(0, 10, 11, start_ok).await?;
        let tune = connection.expect(0, 10, 30).await?; // connection.tune
        let mut tune = Reader(&tune);
        let channel_max = tune.u16()?;
        let frame_max = tune.u32()?;
        if frame_max != 0 {
            connection.frame_max = (frame_max as usize).min(connection.frame_max);
        }
        let tune_ok = Args::default().u16(channel_max).u32(connection.frame_max as u32).u16(0);
        connection.method(0, 10, 31, tune_ok).await?;
        connection.method(0, 10, 40, Args::default().short(login.vhost).short("").u8(0)).await?;
        connection.expect(0, 10, 41).await?;
        connection.method(CHANNEL, 20, 10, Args::default().short("")).await?;
        connection.expect(CHANNEL, 20, 11).await?;
        connection.method(CHANNEL, 85, 10, Args::default().u8(0)).await?; // confirm.select
        connection.expect(CHANNEL, 85, 11).await?;
        Ok(connection)
    }

    /// Whether `exchange` exists (`exchange.declare`, passive).
    ///
    /// # Errors
    /// 404 when it does not; a broken connection.
    pub async fn check_exchange(&mut self, exchange: &str) -> Result<(), AmqpError> {
        let declare = Args::default().u16(0).short(exchange).short("").u8(1).u32(0);
        self.method(CHANNEL, 40, 10, declare).await?;
        self.expect(CHANNEL, 40, 11).await.map(|_| ())
    }

    /// Publishes `messages` to `exchange` and waits for the broker to confirm every one.
    ///
    /// # Errors
    /// A nack, a channel or connection closed by the broker, a broken connection.
    pub async fn publish_all(
        &mut self,
        exchange: &str,
        persistent: bool,
        messages: &[Message<'_>],
    ) -> Result<(), AmqpError> {
        let first = self.next_tag;
        for message in messages {
            self.publish(exchange, persistent, message).await?;
        }
        self.stream.flush().await.map_err(|error| broken(error.kind()))?;
        let last = self.next_tag - 1;
        let mut open: BTreeSet<u64> = (first..=last).collect();
        while !open.is_empty() {
            match self.next_method().await? {
                Method::Ack { tag, multiple } => {
                    if multiple {
                        open.retain(|t| *t > tag)
                    } else {
                        open.remove(&tag);
                    }
                }
                Method::Nack => {
                    return Err(AmqpError {
                        code: 0,
                        text: "the broker refused (nacked) a message".to_owned(),
                    });
                }
                Method::ChannelClose(error) | Method::ConnectionClose(error) => return Err(error),
                Method::Other(..) => {}
            }
        }
        Ok(())
    }

    async fn publish(
        &mut self,
        exchange: &str,
        persistent: bool,
        message: &Message<'_>,
    ) -> Result<(), AmqpError> {
        let publish = Args::default().u16(0).short(exchange).short(message.routing_key).u8(0);
        self.frame(FRAME_METHOD, CHANNEL, &[&[0, 60, 0, 40], &publish.0]).await?;
        // content-type, headers, delivery-mode, message-id
        let flags: u16 = (1 << 15) | (1 << 13) | (1 << 12) | (1 << 7);
        let header = Args::default()
            .u16(60)
            .u16(0)
            .u32(0)
            .u32(message.body.len() as u32)
            .u16(flags)
            .short("application/json")
            .table(&[("sluice_batch_id", message.batch_id)], &[])
            .u8(if persistent { 2 } else { 1 })
            .short(message.message_id);
        self.frame(FRAME_HEADER, CHANNEL, &[&header.0]).await?;
        for chunk in message.body.chunks(self.frame_max - 8) {
            self.frame(FRAME_BODY, CHANNEL, &[chunk]).await?;
        }
        self.next_tag += 1;
        Ok(())
    }

    /// Closes the connection politely.
    pub async fn close(&mut self) {
        let close = Args::default().u16(200).short("bye").u16(0).u16(0);
        if self.method(0, 10, 50, close).await.is_ok() {
            let _ = tokio::time::timeout(std::time::Duration::from_secs(2), self.expect(0, 10, 51))
                .await;
        }
        let _ = self.stream.shutdown().await;
    }

    async fn write_raw(&mut self, bytes: &[u8]) -> Result<(), AmqpError> {
        self.stream.write_all(bytes).await.map_err(|error| broken(error.kind()))?;
        self.stream.flush().await.map_err(|error| broken(error.kind()))
    }

    async fn frame(&mut self, kind: u8, channel: u16, parts: &[&[u8]]) -> Result<(), AmqpError> {
        let size: usize = parts.iter().map(|p| p.len()).sum();
        let mut head = [0u8; 7];
        head[0] = kind;
        head[1..3].copy_from_slice(&channel.to_be_bytes());
        head[3..7].copy_from_slice(&(size as u32).to_be_bytes());
        let write = async {
            self.stream.write_all(&head).await?;
            for part in parts {
                self.stream.write_all(part).await?;
            }
            self.stream.write_all(&[FRAME_END]).await
        };
        write.await.map_err(|error| broken(error.kind()))
    }

    async fn method(
        &mut self,
        channel: u16,
        class: u16,
        method: u16,
        args: Args,
    ) -> Result<(), AmqpError> {
        let mut id = [0u8; 4];
        id[..2].copy_from_slice(&class.to_be_bytes());
        id[2..].copy_from_slice(&method.to_be_bytes());
        self.frame(FRAME_METHOD, channel, &[&id, &args.0]).await?;
        self.stream.flush().await.map_err(|error| broken(error.kind()))
    }

    async fn read_frame(&mut self) -> Result<Frame, AmqpError> {
        let mut head = [0u8; 7];
        self.stream.read_exact(&mut head).await.map_err(|error| broken(error.kind()))?;
        if &head[..4] == b"AMQP" {
            return Err(broken("the server does not speak AMQP 0.9.1"));
        }
        let size = u32::from_be_bytes(head[3..7].try_into().expect("four bytes")) as usize;
        let mut payload = vec![0; size + 1];
        self.stream.read_exact(&mut payload).await.map_err(|error| broken(error.kind()))?;
        if payload.pop() != Some(FRAME_END) {
            return Err(broken("a frame without its end marker"));
        }
        let channel = u16::from_be_bytes([head[1], head[2]]);
        Ok(Frame { kind: head[0], channel, payload })
    }

    /// The next method frame, answering the broker's closes and passing over heartbeats and
    /// content frames.
    async fn next_method(&mut self) -> Result<Method, AmqpError> {
        loop {
            let frame = self.read_frame().await?;
            if frame.kind == FRAME_HEARTBEAT || frame.kind != FRAME_METHOD {
                continue;
            }
            let mut args = Reader(&frame.payload);
            let (class, method) = (args.u16()?, args.u16()?);
            return Ok(match (class, method) {
                (60, 80) | (60, 120) => {
                    let tag = args.u64()?;
                    let multiple = args.u8()? & 1 == 1;
                    if method == 80 { Method::Ack { tag, multiple } } else { Method::Nack }
                }
                (20, 40) | (10, 50) => {
                    let code = args.u16()?;
                    let text = args.short()?;
                    let error = AmqpError { code, text };
                    if class == 20 {
                        self.method(frame.channel, 20, 41, Args::default()).await?;
                        Method::ChannelClose(error)
                    } else {
                        let _ = self.method(0, 10, 51, Args::default()).await;
                        Method::ConnectionClose(error)
                    }
                }
                _ => Method::Other(class, method, args.0.to_vec()),
            });
        }
    }

    /// Waits for method `(class, method)` on `channel` and answers its arguments.
    async fn expect(
        &mut self,
        channel: u16,
        class: u16,
        method: u16,
    ) -> Result<Vec<u8>, AmqpError> {
        loop {
            match self.next_method().await? {
                Method::Other(c, m, args) if (c, m) == (class, method) => {
                    let _ = channel;
                    return Ok(args);
                }
                Method::ChannelClose(error) | Method::ConnectionClose(error) => return Err(error),
                _ => {}
            }
        }
    }
}

/// A message taken from a queue ([`Connection::get`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Got {
    pub routing_key: String,
    pub content_type: Option<String>,
    pub delivery_mode: Option<u8>,
    pub message_id: Option<String>,
    /// The `headers` table, raw (field-table bytes).
    pub headers: Vec<u8>,
    pub body: Vec<u8>,
}

/// What tests (and operators' tools) need besides publishing: make an exchange and a bound
/// queue, and take messages from it.
impl Connection {
    /// Declares exchange `name` of `kind` (`direct`, `topic`, …), deleted with its last
    /// binding.
    ///
    /// # Errors
    /// A refusal, a broken connection.
    pub async fn declare_exchange(&mut self, name: &str, kind: &str) -> Result<(), AmqpError> {
        let declare = Args::default().u16(0).short(name).short(kind).u8(1 << 2).u32(0);
        self.method(CHANNEL, 40, 10, declare).await?;
        self.expect(CHANNEL, 40, 11).await.map(|_| ())
    }

    /// Declares queue `name` (deleted with the connection) bound to `exchange` by `key`.
    ///
    /// # Errors
    /// A refusal, a broken connection.
    pub async fn bound_queue(
        &mut self,
        name: &str,
        exchange: &str,
        key: &str,
    ) -> Result<(), AmqpError> {
        let declare = Args::default().u16(0).short(name).u8(1 << 2).u32(0);
        self.method(CHANNEL, 50, 10, declare).await?;
        self.expect(CHANNEL, 50, 11).await?;
        let bind = Args::default().u16(0).short(name).short(exchange).short(key).u8(0).u32(0);
        self.method(CHANNEL, 50, 20, bind).await?;
        self.expect(CHANNEL, 50, 21).await.map(|_| ())
    }

    /// Takes the next message of `queue` (`basic.get`, no ack); `None` when it is empty.
    ///
    /// # Errors
    /// A refusal, a broken connection.
    pub async fn get(&mut self, queue: &str) -> Result<Option<Got>, AmqpError> {
        self.method(CHANNEL, 60, 70, Args::default().u16(0).short(queue).u8(1)).await?;
        let args = loop {
            match self.next_method().await? {
                Method::Other(60, 72, _) => return Ok(None),
                Method::Other(60, 71, args) => break args,
                Method::ChannelClose(error) | Method::ConnectionClose(error) => return Err(error),
                _ => {}
            }
        };
        let mut reader = Reader(&args);
        let _tag = reader.u64()?;
        let _redelivered = reader.u8()?;
        let _exchange = reader.short()?;
        let routing_key = reader.short()?;
        let header = loop {
            let frame = self.read_frame().await?;
            if frame.kind == FRAME_HEADER {
                break frame.payload;
            }
        };
        let mut props = Reader(&header);
        let (_class, _weight, size, flags) =
            (props.u16()?, props.u16()?, props.u64()?, props.u16()?);
        let mut got = Got {
            routing_key,
            content_type: None,
            delivery_mode: None,
            message_id: None,
            headers: Vec::new(),
            body: Vec::new(),
        };
        let bit = |n: u16| flags & (1 << n) != 0;
        if bit(15) {
            got.content_type = Some(props.short()?);
        }
        if bit(14) {
            props.short()?;
        }
        if bit(13) {
            got.headers = props.long()?;
        }
        if bit(12) {
            got.delivery_mode = Some(props.u8()?);
        }
        if bit(11) {
            props.u8()?;
        }
        for n in [10, 9, 8] {
            if bit(n) {
                props.short()?;
            }
        }
        if bit(7) {
            got.message_id = Some(props.short()?);
        }
        while (got.body.len() as u64) < size {
            let frame = self.read_frame().await?;
            if frame.kind == FRAME_BODY {
                got.body.extend_from_slice(&frame.payload);
            }
        }
        Ok(Some(got))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_encodes_as_the_specification_lays_it_out() {
        let args = Args::default().table(&[("a", "xy")], &[("c", &["f"])]);
        // length 4 + ("a", 'S', len 2, "xy") = 1+1+1+4+2 = 9, ("c", 'F', len 4, ("f", 't', 1)) = 1+1+1+4+4 = 11
        assert_eq!(&args.0[..4], &20u32.to_be_bytes());
        assert_eq!(&args.0[4..13], b"\x01aS\x00\x00\x00\x02xy");
        assert_eq!(&args.0[13..], b"\x01cF\x00\x00\x00\x04\x01ft\x01");
        let mut reader = Reader(b"\x03abc\x00\x00\x00\x01z");
        assert_eq!(reader.short().unwrap(), "abc");
        assert_eq!(reader.long().unwrap(), b"z");
        assert!(reader.u8().is_err());
    }
}
