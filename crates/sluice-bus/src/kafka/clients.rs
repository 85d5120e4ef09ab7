//! The log's clients: how [`KafkaLog::connect`] configures and makes them, the context that
//! sends librdkafka's own logging to `tracing`, and the threads their blocking calls run on.
//! Every client's settings are written here, side by side.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::admin::AdminClient;
use rdkafka::client::ClientContext;
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use sluice_core::clock::Clock;

use super::groups::GroupOffsets;
use super::producer::Producer;
use super::readers::Readers;
use super::tails::{self, Tails};
use super::{Inner, KafkaLog, KafkaSettings};
use crate::{BusError, Result};

/// How long [`KafkaLog::connect`] waits for a TCP connection to a bootstrap server.
const REACH_TIMEOUT: Duration = Duration::from_secs(4);
/// How long an appended record may wait for the brokers before the append fails.
const DELIVERY_TIMEOUT_MS: &str = "30000";
/// Largest record the producer sends (the brokers' `message.max.bytes` may be lower).
const MAX_MESSAGE_BYTES: &str = "8388608";
/// Threads for librdkafka's blocking calls (metadata, watermarks, placing and parking
/// cursors): at most this many run at once, more wait.
pub(super) const BLOCKING_THREADS: usize = 4;

impl KafkaLog {
    /// Connects to the cluster and checks that a broker answers.
    ///
    /// # Errors
    /// [`BusError::Unreachable`] naming the URL when no broker answers in time; a client
    /// setting librdkafka refuses.
    pub async fn connect(settings: KafkaSettings, clock: Arc<dyn Clock>) -> Result<Self> {
        Self::check_reachable(&settings, REACH_TIMEOUT).await?;
        // Until a broker has answered, librdkafka's retries (dozens of lines a second for a
        // broker that refuses) stay out of the log; the last one is kept for the error.
        let context = Context::connecting();
        let base = client_config(&settings);
        let admin: AdminClient<Context> =
            base.create_with_context(context.clone()).map_err(backend)?;
        let admin = Arc::new(admin);
        let groups = GroupOffsets::start(admin.clone())
            .map_err(|error| BusError::Backend { source: Box::new(error), transient: true })?;
        let producer = Producer::new(producer_config(&base), &context)?;
        let meta: BaseConsumer<Context> = consumer_config(&settings, None)
            .create_with_context(context.clone())
            .map_err(backend)?;
        let meta = Arc::new(meta);
        let blocking = Blocking::start()?;
        let probe = meta.clone();
        let reached =
            blocking.run(move || probe.fetch_metadata(None, Duration::from_secs(10))).await;
        if let Err(error) = reached {
            // The context stays quiet: the clients report more until they are dropped.
            let reason = match context.last_word() {
                Some(last) => format!("{error} (librdkafka: {last})"),
                None => error.to_string(),
            };
            return Err(BusError::Unreachable { url: settings.redacted(), reason });
        }
        context.connected();
        let readers = start_readers(&settings, &blocking)?;
        let tail_clients = tail_clients(&settings, meta.clone());
        Ok(Self {
            inner: Arc::new(Inner {
                settings,
                clock,
                admin,
                producer,
                meta,
                blocking,
                topics: Mutex::new(HashMap::new()),
                groups,
                readers,
                tails: Arc::new(Tails::default()),
                tail_clients,
            }),
        })
    }

    /// Checks that a TCP connection to one of the bootstrap servers opens within `within`
    /// (resolving their names on the way), without making a Kafka client: a broker that
    /// refuses is an error at once, in one line, instead of librdkafka's retries.
    ///
    /// # Errors
    /// [`BusError::Unreachable`] naming the URL and why the last server could not be reached.
    pub async fn check_reachable(settings: &KafkaSettings, within: Duration) -> Result<()> {
        let mut attempts = tokio::task::JoinSet::new();
        for server in settings.bootstrap_servers.split(',').map(str::to_owned) {
            attempts.spawn(async move {
                match tokio::time::timeout(within, tokio::net::TcpStream::connect(&server)).await {
                    Ok(Ok(_)) => Ok(()),
                    Ok(Err(error)) => Err(format!("{server}: {}", connect_reason(&error))),
                    Err(_) => Err(format!("{server}: no answer within {} s", within.as_secs())),
                }
            });
        }
        let results: Vec<std::result::Result<(), String>> = attempts.join_all().await;
        if results.iter().any(Result::is_ok) {
            return Ok(());
        }
        let reasons: Vec<String> = results.into_iter().filter_map(Result::err).collect();
        let reason = if reasons.len() == 1 {
            // One server: its address is already in the URL.
            reasons[0].split_once(": ").map_or(reasons[0].clone(), |(_, why)| why.to_owned())
        } else {
            reasons.join("; ")
        };
        Err(BusError::Unreachable { url: settings.redacted(), reason })
    }
}

/// The producer's settings: idempotent, acknowledged by every in-sync replica.
fn producer_config(base: &ClientConfig) -> ClientConfig {
    base.clone()
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "2")
        .set("message.timeout.ms", DELIVERY_TIMEOUT_MS)
        .set("message.max.bytes", MAX_MESSAGE_BYTES)
        .set("queue.buffering.max.messages", "1000000")
        .clone()
}

/// The readers' pool, and the task that parks its idle cursors (and closes old ones) until
/// the log is dropped.
fn start_readers(settings: &KafkaSettings, blocking: &Blocking) -> Result<Arc<Readers>> {
    let lane_settings = settings.clone();
    let readers = Arc::new(Readers::new(Box::new(move || {
        consumer_config(&lane_settings, None)
            .set("enable.partition.eof", "true")
            .set("fetch.wait.max.ms", lane_settings.fetch_wait_ms.to_string())
            .set("queued.max.messages.kbytes", "16384")
            .create_with_context(Context::default())
            .map_err(backend)
    }))?);
    let sweeping = Arc::downgrade(&readers);
    let sweeper = blocking.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_secs(1));
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            let Some(readers) = sweeping.upgrade() else { return };
            let swept = sweeper.run(move || {
                readers.sweep();
                Ok(())
            });
            if swept.await.is_err() {
                return;
            }
        }
    });
    Ok(readers)
}

/// How the chain streams' tail consumer is made (when someone first watches one).
fn tail_clients(settings: &KafkaSettings, meta: Arc<BaseConsumer<Context>>) -> tails::TailClients {
    let tail_settings = settings.clone();
    let make_tail: tails::MakeTail = Arc::new(move || {
        let consumer = consumer_config(&tail_settings, None)
            .set("fetch.wait.max.ms", tail_settings.fetch_wait_ms.to_string())
            .set("queued.max.messages.kbytes", "1024")
            .create_with_context(Context::default());
        match consumer {
            Ok(consumer) => Some(consumer),
            Err(error) => {
                tracing::warn!(%error, "cannot follow topics; local appends only");
                None
            }
        }
    });
    tails::TailClients { make: make_tail, meta }
}

/// Runs blocking librdkafka calls off the async threads, on [`BLOCKING_THREADS`] threads of
/// its own (tokio's blocking pool would grow a thread per call waiting at once); calls queue
/// for a free thread.
#[derive(Clone)]
pub(super) struct Blocking {
    jobs: std::sync::mpsc::Sender<Job>,
}

type Job = Box<dyn FnOnce() + Send>;

impl Blocking {
    /// Starts the threads; they end when the last handle is dropped.
    pub(super) fn start() -> Result<Self> {
        let (jobs, queue) = std::sync::mpsc::channel::<Job>();
        let queue = Arc::new(Mutex::new(queue));
        for n in 0..BLOCKING_THREADS {
            let queue = queue.clone();
            std::thread::Builder::new()
                .name(format!("kafka-blocking-{n}"))
                .spawn(move || {
                    loop {
                        // The lock is held only while waiting for a job, not while it runs.
                        let job = queue.lock().expect("blocking queue mutex").recv();
                        match job {
                            // A call that panics fails its caller (its answer is dropped),
                            // not the thread.
                            Ok(job) => {
                                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                            }
                            Err(_) => return,
                        }
                    }
                })
                .map_err(|error| BusError::Backend { source: Box::new(error), transient: true })?;
        }
        Ok(Self { jobs })
    }

    pub(super) async fn run<T: Send + 'static>(
        &self,
        call: impl FnOnce() -> Result<T, KafkaError> + Send + 'static,
    ) -> Result<T, KafkaError> {
        let (done, result) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move || {
            // The caller may have stopped waiting.
            let _ = done.send(call());
        });
        if self.jobs.send(job).is_err() {
            return Err(KafkaError::Canceled);
        }
        result.await.unwrap_or(Err(KafkaError::Canceled))
    }
}

/// A client error as a [`BusError`]: transient unless retrying cannot help.
pub(crate) fn backend(error: KafkaError) -> BusError {
    let permanent = matches!(
        error.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::InvalidConfig
                | RDKafkaErrorCode::InvalidPartitions
                | RDKafkaErrorCode::InvalidReplicationFactor
                | RDKafkaErrorCode::InvalidTopic
                | RDKafkaErrorCode::TopicAuthorizationFailed
                | RDKafkaErrorCode::GroupAuthorizationFailed
                | RDKafkaErrorCode::ClusterAuthorizationFailed
                | RDKafkaErrorCode::SaslAuthenticationFailed
                | RDKafkaErrorCode::MessageSizeTooLarge
                | RDKafkaErrorCode::InvalidRecord
                | RDKafkaErrorCode::UnsupportedVersion
        )
    ) || matches!(error, KafkaError::ClientCreation(_));
    BusError::Backend { source: Box::new(error), transient: !permanent }
}

/// Settings every client shares: the brokers and the cluster's security settings.
pub(super) fn client_config(settings: &KafkaSettings) -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", &settings.bootstrap_servers);
    config.set_log_level(RDKafkaLogLevel::Warning);
    for (name, value) in &settings.client {
        config.set(name, value);
    }
    config
}

/// A consumer that never joins a group: assigned partitions, explicit commits.
pub(super) fn consumer_config(settings: &KafkaSettings, group: Option<&str>) -> ClientConfig {
    let mut config = client_config(settings);
    config
        .set("group.id", group.unwrap_or("sluice-reader"))
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_committed")
        .set("allow.auto.create.topics", "false");
    config
}

/// Sends librdkafka's own log lines and errors to `tracing`. The clients [`KafkaLog::connect`]
/// makes share one context that is quiet until a broker answered: their warnings go to
/// `debug` meanwhile, and the last one is kept for the error if none ever does.
#[derive(Clone, Default)]
pub(crate) struct Context {
    connecting: Option<Arc<Connecting>>,
}

#[derive(Default)]
struct Connecting {
    done: std::sync::atomic::AtomicBool,
    last: Mutex<Option<String>>,
}

impl Context {
    fn connecting() -> Self {
        Self { connecting: Some(Arc::default()) }
    }

    /// Ends the quiet period: a broker answered.
    fn connected(&self) {
        if let Some(connecting) = &self.connecting {
            connecting.done.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// The last warning or error librdkafka reported while quiet.
    fn last_word(&self) -> Option<String> {
        self.connecting.as_ref()?.last.lock().expect("kafka context mutex").take()
    }

    /// Whether `message` was kept aside because no broker has answered yet.
    fn kept_quiet(&self, message: impl FnOnce() -> String) -> bool {
        let Some(connecting) = &self.connecting else { return false };
        if connecting.done.load(std::sync::atomic::Ordering::Relaxed) {
            return false;
        }
        let message = message();
        tracing::debug!(target: "kafka", "{message}");
        *connecting.last.lock().expect("kafka context mutex") = Some(message);
        true
    }
}

impl ClientContext for Context {
    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        match level {
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error
            | RDKafkaLogLevel::Warning
                if self.kept_quiet(|| message.to_owned()) => {}
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error => tracing::error!(target: "kafka", facility, "{message}"),
            RDKafkaLogLevel::Warning => tracing::warn!(target: "kafka", facility, "{message}"),
            _ => tracing::debug!(target: "kafka", facility, "{message}"),
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if is_end_of_partition(&error) {
            tracing::trace!(target: "kafka", %error, "{reason}");
        } else if !self.kept_quiet(|| format!("{error}: {reason}")) {
            tracing::warn!(target: "kafka", %error, "{reason}");
        }
    }
}

/// Why a TCP connection failed, in a few words ("connection refused").
pub(super) fn connect_reason(error: &std::io::Error) -> String {
    use std::io::ErrorKind::{
        ConnectionRefused, ConnectionReset, HostUnreachable, NetworkUnreachable, TimedOut,
    };
    match error.kind() {
        kind @ (ConnectionRefused | ConnectionReset | HostUnreachable | NetworkUnreachable
        | TimedOut) => kind.to_string(),
        _ => error.to_string(),
    }
}

/// Whether a client error is only a reader reaching a partition's end: the readers ask for
/// that event (`enable.partition.eof`, so an empty partition answers at once), and librdkafka
/// reports it through the error callback too. Logged as a warning it would repeat once per
/// idle fetch of every reader.
pub(super) fn is_end_of_partition(error: &KafkaError) -> bool {
    matches!(
        error,
        KafkaError::Global(RDKafkaErrorCode::PartitionEOF)
            | KafkaError::PartitionEOF(_)
            | KafkaError::MessageConsumption(RDKafkaErrorCode::PartitionEOF)
    )
}

impl ConsumerContext for Context {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_end_of_a_partition_is_kept_out_of_the_warnings() {
        for end in [
            KafkaError::Global(RDKafkaErrorCode::PartitionEOF),
            KafkaError::PartitionEOF(3),
            KafkaError::MessageConsumption(RDKafkaErrorCode::PartitionEOF),
        ] {
            assert!(is_end_of_partition(&end), "{end}");
        }
        for problem in [
            KafkaError::Global(RDKafkaErrorCode::BrokerTransportFailure),
            KafkaError::Global(RDKafkaErrorCode::AllBrokersDown),
            KafkaError::MessageConsumption(RDKafkaErrorCode::UnknownTopicOrPartition),
        ] {
            assert!(!is_end_of_partition(&problem), "{problem}");
        }
    }
}
