//! `mooncake master` configuration: upstream's flag names and defaults (spec/master.md §14), an
//! optional TOML (or JSON) file, and validation with clear messages.
//!
//! Flags may be spelled with `_` or `-` (`--rpc_port`, `--rpc-port`) and with one or two leading
//! dashes, as gflags allows. Precedence: built-in default < config file < command line.

use clap::Parser;
use mooncake_common::units::parse_duration_ms;
use serde::{Deserialize, Serialize};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use thiserror::Error;

/// Why a configuration was refused at start-up.
#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("{0}")]
    Flags(String),
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid value for --{flag}: {message}")]
    Invalid { flag: &'static str, message: String },
}

/// Every setting of the master process. Field names are upstream's flag names.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Parser)]
#[command(
    name = "mooncake master",
    about = "Run the mooncake-rs master (metadata service)",
    rename_all = "snake_case"
)]
#[serde(default, deny_unknown_fields)]
pub struct MasterConfig {
    /// TOML or JSON file with the same keys as the flags (`--config_path` is accepted too).
    #[arg(long = "config", alias = "config_path")]
    #[serde(skip)]
    pub config: Option<PathBuf>,

    /// Deprecated port flag; used when `rpc_port` is 0.
    #[arg(long, default_value_t = 50051)]
    pub port: u16,
    /// RPC port (0 = use `port`).
    #[arg(long, default_value_t = 0)]
    pub rpc_port: u16,
    /// RPC bind address.
    #[arg(long, default_value = "0.0.0.0")]
    pub rpc_address: String,
    /// RPC worker threads (0 = `max_threads`, then the number of cores).
    #[arg(long, default_value_t = 0)]
    pub rpc_thread_num: usize,
    /// Deprecated alias of `rpc_thread_num`.
    #[arg(long, default_value_t = 0)]
    pub max_threads: usize,
    /// Close an RPC connection that made a valid request and then sent nothing for this many
    /// seconds (0 = never, upstream's default). Connections that never made one are covered by
    /// `rpc_handshake_timeout_seconds`.
    #[arg(long, default_value_t = 0)]
    pub rpc_conn_timeout_seconds: u64,
    /// TCP_NODELAY on RPC connections.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub rpc_enable_tcp_no_delay: bool,
    /// Connections served at once (ours; upstream has none).
    #[arg(long, default_value_t = 1024)]
    pub rpc_max_connections: usize,
    /// Opt-in low-latency mode: spin on sockets this many microseconds before parking (0 = off).
    #[arg(long, default_value_t = 0)]
    pub busy_poll_us: u64,

    // Limits against idle, slow and hostile peers (ours; docs/security.md).
    /// Close an RPC connection that has not completed a valid request this many seconds after
    /// connecting (0 = never). When the server is full, such connections make room first.
    #[arg(long, default_value_t = 10)]
    pub rpc_handshake_timeout_seconds: u64,
    /// RPC connections served at once from one IP address.
    #[arg(long, default_value_t = 256)]
    pub rpc_max_connections_per_address: usize,
    /// Seconds every request frame (and every write of answers) may take once started, on top
    /// of its length at `rpc_min_request_bytes_per_second`.
    #[arg(long, default_value_t = 10)]
    pub rpc_frame_timeout_seconds: u64,
    /// Slowest rate a request frame may arrive at (and answers may leave at) once started.
    #[arg(long, default_value_t = 1 << 20)]
    pub rpc_min_request_bytes_per_second: u64,
    /// Bytes of request frames over 64 KiB that all RPC connections together may hold; over it
    /// the server stops reading them and sheds the oldest. At least the 16 MiB frame limit.
    #[arg(long, default_value_t = 256 << 20)]
    pub rpc_max_buffered_request_bytes: u64,

    /// Periodic metric log lines.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub enable_metric_reporting: bool,
    /// HTTP admin/metrics port.
    #[arg(long, default_value_t = 9003)]
    pub metrics_port: u16,
    /// HTTP admin/metrics bind address.
    #[arg(long, default_value = "0.0.0.0")]
    pub metrics_host: String,

    /// Read lease granted by reads: raw milliseconds or a duration with ms/s/m/h.
    #[arg(long, default_value = "10000")]
    pub default_kv_lease_ttl: String,
    /// Soft-pin TTL used when a put asks for a soft pin without a TTL.
    #[arg(long, default_value = "1800000")]
    pub default_kv_soft_pin_ttl: String,
    /// Largest soft-pin TTL a put may ask for.
    #[arg(long, default_value = "86400000")]
    pub max_kv_soft_pin_ttl: String,
    /// Whether eviction may take soft-pinned objects (after every unpinned one).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub allow_evict_soft_pinned_objects: bool,
    /// Fraction of capacity one eviction cycle frees, in [0, 1].
    #[arg(long, default_value_t = 0.05)]
    pub eviction_ratio: f64,
    /// Usage ratio above which eviction runs, in (0, 1].
    #[arg(long, default_value_t = 0.90)]
    pub eviction_high_watermark_ratio: f64,

    /// Seconds a client stays alive after its last ping.
    #[arg(long, alias = "client_live_ttl_sec", default_value_t = 10)]
    pub client_ttl: u64,
    /// Seconds after which an unfinished put may be pre-empted.
    #[arg(long, default_value_t = 30)]
    pub put_start_discard_timeout_sec: u64,
    /// Seconds after which the space of an unfinished put is released (must exceed the discard timeout).
    #[arg(long, default_value_t = 600)]
    pub put_start_release_timeout_sec: u64,

    /// Buffer allocator: `offset` (the only one; `cachelib` is refused as upstream deprecated it).
    #[arg(long, default_value = "offset")]
    pub memory_allocator: String,
    /// `random`, `free_ratio_first` or `local_first`.
    #[arg(long, default_value = "random")]
    pub allocation_strategy: String,

    /// Strict multi-tenant namespaces and quotas.
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub enable_multi_tenants: bool,
    /// Tenant policy connector type (`file`).
    #[arg(long, default_value = "file")]
    pub tenant_quota_connector_type: String,
    /// Tenant policy file (YAML `version: 1`).
    #[arg(long, default_value = "")]
    pub tenant_quota_connector_uri: String,

    /// Serve upstream's `/metadata?key=` store for tools that expect it.
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub enable_http_metadata_server: bool,
    /// Bind address of the metadata server.
    #[arg(long, default_value = "0.0.0.0")]
    pub http_metadata_server_host: String,
    /// Port of the metadata server.
    #[arg(long, default_value_t = 8080)]
    pub http_metadata_server_port: u16,

    /// Cluster name reported by `/health`.
    #[arg(long, default_value = "mooncake_cluster")]
    pub cluster_id: String,
}

impl Default for MasterConfig {
    fn default() -> Self {
        // The clap defaults are the single source of truth.
        MasterConfig::parse_from(["mooncake-master"])
    }
}

/// Durations and addresses resolved from a validated [`MasterConfig`].
#[derive(Debug, Clone, PartialEq)]
pub struct ResolvedConfig {
    pub rpc_addr: SocketAddr,
    pub metrics_addr: SocketAddr,
    pub metadata_addr: Option<SocketAddr>,
    pub rpc_threads: usize,
    pub default_kv_lease_ttl_ms: u64,
    pub default_kv_soft_pin_ttl_ms: u64,
    pub max_kv_soft_pin_ttl_ms: u64,
}

/// Rewrites gflags spellings (`-rpc-port=1`, `--rpc-port 1`) into the canonical `--rpc_port`.
fn normalize_args<I, S>(args: I) -> Vec<String>
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    args.into_iter()
        .map(Into::into)
        .enumerate()
        .map(|(i, arg)| {
            let is_flag = arg.starts_with('-')
                && arg.len() > 1
                && !arg[1..].starts_with(|c: char| c.is_ascii_digit());
            if i == 0 || !is_flag || arg == "-" || arg == "--" {
                return arg;
            }
            let body = arg.trim_start_matches('-');
            let (name, value) = match body.split_once('=') {
                Some((name, value)) => (name, Some(value)),
                None => (body, None),
            };
            let name = name.replace('-', "_");
            let short_help = name == "h";
            let prefix = if short_help { "-" } else { "--" };
            match value {
                Some(value) => format!("{prefix}{name}={value}"),
                None => format!("{prefix}{name}"),
            }
        })
        .collect()
}

impl MasterConfig {
    /// Parses the command line (program name first), reads `--config` if given, and validates.
    /// Command-line flags override the file.
    pub fn load<I, S>(args: I) -> Result<(MasterConfig, ResolvedConfig), ConfigError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let args = normalize_args(args);
        let flags =
            MasterConfig::try_parse_from(&args).map_err(|e| ConfigError::Flags(e.to_string()))?;
        let config = match &flags.config {
            None => flags,
            Some(path) => {
                let from_file = MasterConfig::from_file(path)?;
                let matches = <MasterConfig as clap::CommandFactory>::command()
                    .try_get_matches_from(&args)
                    .map_err(|e| ConfigError::Flags(e.to_string()))?;
                merge_explicit(from_file, flags, &matches)?
            }
        };
        let resolved = config.validate()?;
        Ok((config, resolved))
    }

    /// Reads a TOML (or, by extension `.json`, JSON) file of flag values.
    pub fn from_file(path: &std::path::Path) -> Result<MasterConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let parse_error = |message: String| ConfigError::Parse {
            path: path.to_path_buf(),
            message,
        };
        let mut config: MasterConfig = if path.extension().is_some_and(|e| e == "json") {
            serde_json::from_str(&text).map_err(|e| parse_error(e.to_string()))?
        } else {
            toml::from_str(&text).map_err(|e| parse_error(e.to_string()))?
        };
        config.config = Some(path.to_path_buf());
        Ok(config)
    }

    /// Checks every value; returns the resolved addresses and durations.
    pub fn validate(&self) -> Result<ResolvedConfig, ConfigError> {
        let invalid = |flag: &'static str, message: String| ConfigError::Invalid { flag, message };
        let duration = |flag: &'static str, text: &str| {
            parse_duration_ms(text).map_err(|e| invalid(flag, e.to_string()))
        };
        let default_kv_lease_ttl_ms = duration("default_kv_lease_ttl", &self.default_kv_lease_ttl)?;
        let default_kv_soft_pin_ttl_ms =
            duration("default_kv_soft_pin_ttl", &self.default_kv_soft_pin_ttl)?;
        let max_kv_soft_pin_ttl_ms = duration("max_kv_soft_pin_ttl", &self.max_kv_soft_pin_ttl)?;
        if default_kv_lease_ttl_ms == 0 {
            return Err(invalid("default_kv_lease_ttl", "must be positive".into()));
        }
        if default_kv_soft_pin_ttl_ms > max_kv_soft_pin_ttl_ms {
            return Err(invalid(
                "default_kv_soft_pin_ttl",
                format!("{default_kv_soft_pin_ttl_ms} ms exceeds max_kv_soft_pin_ttl ({max_kv_soft_pin_ttl_ms} ms)"),
            ));
        }
        if !(0.0..=1.0).contains(&self.eviction_ratio) {
            return Err(invalid(
                "eviction_ratio",
                format!("{} is not in [0, 1]", self.eviction_ratio),
            ));
        }
        if !(self.eviction_high_watermark_ratio > 0.0 && self.eviction_high_watermark_ratio <= 1.0)
        {
            return Err(invalid(
                "eviction_high_watermark_ratio",
                format!("{} is not in (0, 1]", self.eviction_high_watermark_ratio),
            ));
        }
        if self.client_ttl == 0 {
            return Err(invalid("client_ttl", "must be at least 1 second".into()));
        }
        if self.put_start_release_timeout_sec <= self.put_start_discard_timeout_sec {
            return Err(invalid(
                "put_start_release_timeout_sec",
                format!(
                    "{} must be greater than put_start_discard_timeout_sec ({})",
                    self.put_start_release_timeout_sec, self.put_start_discard_timeout_sec
                ),
            ));
        }
        match self.memory_allocator.as_str() {
            "offset" => {}
            "cachelib" => {
                return Err(invalid(
                    "memory_allocator",
                    "cachelib is deprecated upstream and not implemented; use offset".into(),
                ))
            }
            other => {
                return Err(invalid(
                    "memory_allocator",
                    format!("unknown allocator {other:?} (offset)"),
                ))
            }
        }
        if !["random", "free_ratio_first", "local_first"]
            .contains(&self.allocation_strategy.as_str())
        {
            return Err(invalid(
                "allocation_strategy",
                format!(
                    "unknown or unsupported strategy {:?} (random, free_ratio_first, local_first)",
                    self.allocation_strategy
                ),
            ));
        }
        if self.tenant_quota_connector_type != "file" {
            return Err(invalid(
                "tenant_quota_connector_type",
                format!(
                    "unknown connector {:?} (file)",
                    self.tenant_quota_connector_type
                ),
            ));
        }
        if self.rpc_max_connections == 0 {
            return Err(invalid("rpc_max_connections", "must be at least 1".into()));
        }
        self.validate_connection_limits()?;
        let ip = |flag: &'static str, text: &str| {
            text.parse::<IpAddr>()
                .map_err(|_| invalid(flag, format!("{text:?} is not an IP address")))
        };
        let rpc_port = if self.rpc_port != 0 {
            self.rpc_port
        } else {
            self.port
        };
        let rpc_addr = SocketAddr::new(ip("rpc_address", &self.rpc_address)?, rpc_port);
        let metrics_addr =
            SocketAddr::new(ip("metrics_host", &self.metrics_host)?, self.metrics_port);
        let metadata_addr = if self.enable_http_metadata_server {
            Some(SocketAddr::new(
                ip("http_metadata_server_host", &self.http_metadata_server_host)?,
                self.http_metadata_server_port,
            ))
        } else {
            None
        };
        let rpc_threads = [self.rpc_thread_num, self.max_threads]
            .into_iter()
            .find(|&n| n > 0)
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()));
        Ok(ResolvedConfig {
            rpc_addr,
            metrics_addr,
            metadata_addr,
            rpc_threads,
            default_kv_lease_ttl_ms,
            default_kv_soft_pin_ttl_ms,
            max_kv_soft_pin_ttl_ms,
        })
    }
}

impl MasterConfig {
    /// The limits against idle, slow and hostile peers.
    fn validate_connection_limits(&self) -> Result<(), ConfigError> {
        let invalid = |flag: &'static str, message: String| ConfigError::Invalid { flag, message };
        if self.rpc_max_connections_per_address == 0 {
            return Err(invalid(
                "rpc_max_connections_per_address",
                "must be at least 1".into(),
            ));
        }
        if self.rpc_frame_timeout_seconds == 0 {
            return Err(invalid(
                "rpc_frame_timeout_seconds",
                "must be at least 1 second".into(),
            ));
        }
        if self.rpc_min_request_bytes_per_second == 0 {
            return Err(invalid(
                "rpc_min_request_bytes_per_second",
                "must be at least 1".into(),
            ));
        }
        let frame_limit = mooncake_proto::DEFAULT_MAX_FRAME_BYTES as u64;
        if self.rpc_max_buffered_request_bytes < frame_limit {
            return Err(invalid(
                "rpc_max_buffered_request_bytes",
                format!(
                    "{} is below the {frame_limit}-byte frame limit (one frame must fit)",
                    self.rpc_max_buffered_request_bytes
                ),
            ));
        }
        Ok(())
    }
}

/// Starts from the file's values and applies only the flags given explicitly on the command line.
fn merge_explicit(
    from_file: MasterConfig,
    flags: MasterConfig,
    matches: &clap::ArgMatches,
) -> Result<MasterConfig, ConfigError> {
    use clap::parser::ValueSource;
    let mut merged =
        serde_json::to_value(&from_file).map_err(|e| ConfigError::Flags(e.to_string()))?;
    let flag_values =
        serde_json::to_value(&flags).map_err(|e| ConfigError::Flags(e.to_string()))?;
    if let (Some(merged), Some(flag_values)) = (merged.as_object_mut(), flag_values.as_object()) {
        for (name, value) in flag_values {
            if matches.value_source(name) == Some(ValueSource::CommandLine) {
                merged.insert(name.clone(), value.clone());
            }
        }
    }
    let mut config: MasterConfig =
        serde_json::from_value(merged).map_err(|e| ConfigError::Flags(e.to_string()))?;
    config.config = from_file.config;
    Ok(config)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn load(args: &[&str]) -> Result<(MasterConfig, ResolvedConfig), ConfigError> {
        let mut all = vec!["mooncake-master"];
        all.extend_from_slice(args);
        MasterConfig::load(all)
    }

    #[test]
    fn defaults_are_upstreams() {
        let (config, resolved) = load(&[]).unwrap();
        assert_eq!(resolved.rpc_addr, "0.0.0.0:50051".parse().unwrap());
        assert_eq!(resolved.metrics_addr, "0.0.0.0:9003".parse().unwrap());
        assert_eq!(resolved.default_kv_lease_ttl_ms, 10_000);
        assert_eq!(resolved.default_kv_soft_pin_ttl_ms, 1_800_000);
        assert_eq!(resolved.max_kv_soft_pin_ttl_ms, 86_400_000);
        assert_eq!(config.eviction_ratio, 0.05);
        assert_eq!(config.eviction_high_watermark_ratio, 0.90);
        assert_eq!(config.client_ttl, 10);
        assert_eq!(config.put_start_discard_timeout_sec, 30);
        assert_eq!(config.put_start_release_timeout_sec, 600);
        assert!(config.allow_evict_soft_pinned_objects);
        assert!(!config.enable_multi_tenants);
        assert_eq!(config.allocation_strategy, "random");
        assert_eq!(resolved.metadata_addr, None);
        assert_eq!(config, MasterConfig::default());
    }

    #[test]
    fn both_spellings_and_gflags_forms_are_accepted() {
        let (config, resolved) = load(&[
            "--rpc-port=6000",
            "-metrics_port",
            "7000",
            "--default-kv-lease-ttl",
            "5s",
            "--enable_multi_tenants",
            "--allow-evict-soft-pinned-objects=false",
            "--client_live_ttl_sec=60",
        ])
        .unwrap();
        assert_eq!(resolved.rpc_addr.port(), 6000);
        assert_eq!(resolved.metrics_addr.port(), 7000);
        assert_eq!(resolved.default_kv_lease_ttl_ms, 5000);
        assert!(config.enable_multi_tenants);
        assert!(!config.allow_evict_soft_pinned_objects);
        assert_eq!(config.client_ttl, 60);
    }

    #[test]
    fn invalid_values_are_refused_with_the_flag_named() {
        let cases: &[(&[&str], &str)] = &[
            (&["--eviction_ratio=1.5"], "eviction_ratio"),
            (
                &["--eviction_high_watermark_ratio=0"],
                "eviction_high_watermark_ratio",
            ),
            (
                &["--put_start_release_timeout_sec=10"],
                "put_start_release_timeout_sec",
            ),
            (&["--allocation_strategy=best"], "allocation_strategy"),
            (&["--memory_allocator=cachelib"], "memory_allocator"),
            (&["--default_kv_lease_ttl=soon"], "default_kv_lease_ttl"),
            (
                &["--default_kv_soft_pin_ttl=2h", "--max_kv_soft_pin_ttl=1h"],
                "default_kv_soft_pin_ttl",
            ),
            (&["--rpc_address=localhost"], "rpc_address"),
            (&["--client_ttl=0"], "client_ttl"),
        ];
        for (args, flag) in cases {
            let err = load(args).unwrap_err();
            assert!(err.to_string().contains(flag), "{args:?} gave {err}");
        }
        assert!(matches!(
            load(&["--no_such_flag=1"]),
            Err(ConfigError::Flags(_))
        ));
        assert!(matches!(
            load(&["--rpc_port=70000"]),
            Err(ConfigError::Flags(_))
        ));
    }

    #[test]
    fn connection_limits_have_their_documented_defaults_and_are_checked() {
        let (config, _) = load(&[]).unwrap();
        assert_eq!(config.rpc_conn_timeout_seconds, 0);
        assert_eq!(config.rpc_handshake_timeout_seconds, 10);
        assert_eq!(config.rpc_max_connections, 1024);
        assert_eq!(config.rpc_max_connections_per_address, 256);
        assert_eq!(config.rpc_frame_timeout_seconds, 10);
        assert_eq!(config.rpc_min_request_bytes_per_second, 1 << 20);
        assert_eq!(config.rpc_max_buffered_request_bytes, 256 << 20);
        let (config, _) = load(&[
            "--rpc-handshake-timeout-seconds=0",
            "--rpc_conn_timeout_seconds=30",
        ])
        .unwrap();
        assert_eq!(config.rpc_handshake_timeout_seconds, 0);
        assert_eq!(config.rpc_conn_timeout_seconds, 30);
        let cases: &[(&str, &str)] = &[
            (
                "--rpc_max_connections_per_address=0",
                "rpc_max_connections_per_address",
            ),
            ("--rpc_frame_timeout_seconds=0", "rpc_frame_timeout_seconds"),
            (
                "--rpc_min_request_bytes_per_second=0",
                "rpc_min_request_bytes_per_second",
            ),
            (
                "--rpc_max_buffered_request_bytes=1048576",
                "rpc_max_buffered_request_bytes",
            ),
        ];
        for (arg, flag) in cases {
            let err = load(&[arg]).unwrap_err();
            assert!(err.to_string().contains(flag), "{arg} gave {err}");
        }
    }

    #[test]
    fn config_file_values_apply_and_flags_override_them() {
        let dir = std::env::temp_dir().join(format!("mc-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("master.toml");
        std::fs::write(
            &path,
            "rpc_port = 6100\neviction_ratio = 0.1\neviction_high_watermark_ratio = 1.0\nclient_ttl = 60\n",
        )
        .unwrap();
        let path_arg = format!("--config={}", path.display());
        let (config, resolved) = load(&[&path_arg, "--client_ttl=5"]).unwrap();
        assert_eq!(resolved.rpc_addr.port(), 6100);
        assert_eq!(config.eviction_ratio, 0.1);
        assert_eq!(config.eviction_high_watermark_ratio, 1.0);
        assert_eq!(config.client_ttl, 5);

        std::fs::write(&path, "rpc_portt = 1\n").unwrap();
        assert!(matches!(load(&[&path_arg]), Err(ConfigError::Parse { .. })));
        let missing = format!("--config_path={}", dir.join("nope.toml").display());
        assert!(matches!(load(&[&missing]), Err(ConfigError::Read { .. })));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
