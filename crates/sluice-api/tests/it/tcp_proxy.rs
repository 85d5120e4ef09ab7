//! A TCP proxy on a loopback port in front of a real server, that a test takes down (every
//! connection through it cut, the port refusing) and brings back on the same port: an
//! outage of the server as a sink sees it.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

pub(crate) struct TcpProxy {
    address: SocketAddr,
    upstream: String,
    tasks: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl TcpProxy {
    /// A proxy to `upstream` (`host:port`), up.
    pub(crate) async fn start(upstream: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy = Self {
            address: listener.local_addr().unwrap(),
            upstream: upstream.to_owned(),
            tasks: Arc::default(),
        };
        proxy.serve(listener);
        proxy
    }

    /// `host:port` of the proxy.
    pub(crate) fn address(&self) -> String {
        self.address.to_string()
    }

    fn serve(&self, listener: TcpListener) {
        let (upstream, tasks) = (self.upstream.clone(), self.tasks.clone());
        let accept = tokio::spawn(async move {
            loop {
                let Ok((mut client, _)) = listener.accept().await else { return };
                let upstream = upstream.clone();
                let pipe = tokio::spawn(async move {
                    if let Ok(mut server) = TcpStream::connect(&upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
                tasks.lock().unwrap().push(pipe);
            }
        });
        self.tasks.lock().unwrap().push(accept);
    }

    /// Cuts every connection and stops listening.
    pub(crate) fn down(&self) {
        for task in self.tasks.lock().unwrap().drain(..) {
            task.abort();
        }
    }

    /// Listens again on the same port.
    pub(crate) async fn up(&self) {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        let listener = loop {
            match TcpListener::bind(self.address).await {
                Ok(listener) => break listener,
                Err(error) => {
                    assert!(tokio::time::Instant::now() < deadline, "cannot listen again: {error}");
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
            }
        };
        self.serve(listener);
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.down();
    }
}
