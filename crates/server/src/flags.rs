//! The machinery under `mooncake master`'s flag table (`config.rs`): what a table line is, how a
//! value is read and printed, gflags-compatible command-line parsing, and config files.
//!
//! Command line (upstream uses gflags; we accept what gflags accepts):
//! - `--name=value`, `--name value` (not for booleans), one or two dashes, `-` or `_` in names;
//! - booleans: bare `--name` (true), `--name=true|false|yes|no|t|f|y|n|1|0`, `--noname` (false);
//! - `--flagfile=FILE` (one flag per line, `#` comments), `--fromenv=a,b` / `--tryfromenv=a,b`
//!   (values from `FLAGS_a`, …), `--undefok=a,b` (unknown flags that may be given and are ignored);
//! - `--help` (and `--helpfull`, `--helpshort`, `--helpmatch=S`, …) and `--version` print and exit.
//!
//! Config file (`--config_path FILE`, alias `--config`), chosen by extension:
//! - `.yaml`/`.yml` and `.json`: upstream's loader. Flat `key: value` with the flag names as keys
//!   (`client_live_ttl_sec` for `client_ttl`); scalars of any type are read as the flag's type; a
//!   nested map becomes dotted keys; sequences are errors. Keys that are not flags are ignored
//!   with a warning, as upstream ignores them (its shipped files carry keys of other versions).
//! - `.toml`: ours; the same keys, and a key that is not a flag is an error.
//!
//! Precedence: built-in default < config file < command line (flagfile and environment included).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::config::{ConfigError, MasterConfig, FLAGS};

/// Upstream's type of a flag (what `--help` prints; the Rust field may be narrower, e.g. ports).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlagType {
    Bool,
    Int32,
    UInt32,
    Int64,
    UInt64,
    Double,
    String,
}

impl FlagType {
    pub fn name(self) -> &'static str {
        match self {
            FlagType::Bool => "bool",
            FlagType::Int32 => "int32",
            FlagType::UInt32 => "uint32",
            FlagType::Int64 => "int64",
            FlagType::UInt64 => "uint64",
            FlagType::Double => "double",
            FlagType::String => "string",
        }
    }
}

/// Where a flag comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// `mooncake_master`'s own flags (upstream `master.cpp`, `utils.cpp`).
    Master,
    /// gflags' built-in flags (`--flagfile`, `--help`, …).
    Gflags,
    /// glog's logging flags.
    Glog,
    /// mooncake-rs only; upstream has no such flag.
    Ours,
}

/// What mooncake-rs does with a flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Implemented: the value is used.
    Honoured,
    /// Turns on a feature mooncake-rs does not build (named here). Accepted at its default (with
    /// a start-up warning when given); any other value is refused.
    Refused(&'static str),
    /// A setting of a feature mooncake-rs does not build (named here), or one with no meaning for
    /// it. Accepted at any value of the right type, without effect (start-up warning when given).
    Inert(&'static str),
}

/// One line of the flag table.
#[derive(Debug, Clone, Copy)]
pub struct FlagSpec {
    pub name: &'static str,
    /// Other names accepted on the command line and in files (`client_live_ttl_sec`).
    pub aliases: &'static [&'static str],
    pub origin: Origin,
    pub ty: FlagType,
    /// The default as the table writes it (a Rust literal; see [`FlagSpec::default_text`]).
    pub default_literal: &'static str,
    pub status: Status,
    /// Upstream's help text (ours for [`Origin::Ours`]).
    pub help: &'static str,
}

impl FlagSpec {
    /// The default as a flag value (`"0.0.0.0"` → `0.0.0.0`).
    pub fn default_text(&self) -> &'static str {
        let d = self.default_literal;
        d.strip_prefix('"')
            .and_then(|d| d.strip_suffix('"'))
            .unwrap_or(d)
    }

    /// Whether `name` (already normalized to `_`) names this flag.
    pub fn is_named(&self, name: &str) -> bool {
        self.name == name || self.aliases.contains(&name)
    }
}

/// The table line of `name` or one of its aliases.
pub fn find_flag(name: &str) -> Option<&'static FlagSpec> {
    FLAGS.iter().find(|f| f.is_named(name))
}

/// A Rust type a flag can have: parsed from and printed as gflags text.
pub trait FlagValue: Sized + PartialEq {
    /// The literal type the table writes defaults in (`&str` for `String`).
    type Lit;
    fn from_lit(lit: Self::Lit) -> Self;
    fn parse_flag(text: &str) -> Result<Self, String>;
    fn to_flag_text(&self) -> String;
}

impl FlagValue for bool {
    type Lit = bool;
    fn from_lit(lit: bool) -> Self {
        lit
    }
    fn parse_flag(text: &str) -> Result<Self, String> {
        match text.trim().to_ascii_lowercase().as_str() {
            "true" | "t" | "yes" | "y" | "1" | "on" => Ok(true),
            "false" | "f" | "no" | "n" | "0" | "off" => Ok(false),
            _ => Err(format!("{text:?} is not a boolean (true or false)")),
        }
    }
    fn to_flag_text(&self) -> String {
        self.to_string()
    }
}

fn parse_integer<T: TryFrom<i128>>(text: &str, what: &str) -> Result<T, String> {
    let t = text.trim();
    let (negative, digits) = match t.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, t.strip_prefix('+').unwrap_or(t)),
    };
    let magnitude = match digits
        .strip_prefix("0x")
        .or_else(|| digits.strip_prefix("0X"))
    {
        Some(hex) => i128::from_str_radix(hex, 16),
        None => digits.parse::<i128>(),
    };
    let value = match magnitude {
        Ok(m) if !digits.starts_with(['+', '-']) => {
            if negative {
                -m
            } else {
                m
            }
        }
        _ => return Err(format!("{text:?} is not a valid {what}")),
    };
    T::try_from(value).map_err(|_| format!("{text:?} is out of range for {what}"))
}

macro_rules! integer_flag {
    ($($t:ty => $what:literal),* $(,)?) => {$(
        impl FlagValue for $t {
            type Lit = $t;
            fn from_lit(lit: $t) -> Self {
                lit
            }
            fn parse_flag(text: &str) -> Result<Self, String> {
                parse_integer(text, $what)
            }
            fn to_flag_text(&self) -> String {
                self.to_string()
            }
        }
    )*};
}

integer_flag!(
    u16 => "port or 16-bit number (0-65535)",
    u32 => "uint32",
    u64 => "uint64",
    usize => "unsigned integer",
    i32 => "int32",
    i64 => "int64",
);

impl FlagValue for f64 {
    type Lit = f64;
    fn from_lit(lit: f64) -> Self {
        lit
    }
    fn parse_flag(text: &str) -> Result<Self, String> {
        match text.trim().parse::<f64>() {
            Ok(v) if v.is_finite() => Ok(v),
            _ => Err(format!("{text:?} is not a finite number")),
        }
    }
    fn to_flag_text(&self) -> String {
        self.to_string()
    }
}

impl FlagValue for String {
    type Lit = &'static str;
    fn from_lit(lit: &'static str) -> Self {
        lit.to_string()
    }
    fn parse_flag(text: &str) -> Result<Self, String> {
        Ok(text.to_string())
    }
    fn to_flag_text(&self) -> String {
        self.clone()
    }
}

/// Flags that steer the parser rather than the master; handled as they are met.
const FLAGFILE: &str = "flagfile";
const FROMENV: &str = "fromenv";
const TRYFROMENV: &str = "tryfromenv";
const UNDEFOK: &str = "undefok";
/// Flags that print something and exit.
const HELP_FLAGS: &[&str] = &[
    "help",
    "helpfull",
    "helpshort",
    "helppackage",
    "helpxml",
    "helpmatch",
    "helpon",
];
const VERSION: &str = "version";
const CONFIG_PATH: &str = "config_path";

/// Flags a config file may only carry at their defaults.
fn file_may_not_set(name: &str) -> bool {
    [FLAGFILE, FROMENV, TRYFROMENV, UNDEFOK, VERSION, CONFIG_PATH].contains(&name)
        || HELP_FLAGS.contains(&name)
}

/// Nested `--flagfile`s deeper than this are refused (a file including itself).
pub const MAX_FLAGFILE_DEPTH: usize = 8;
/// Config files and flagfiles larger than this are refused before being read whole.
pub const MAX_CONFIG_FILE_BYTES: u64 = 4 << 20;

/// What the command line said, before the config file is read.
#[derive(Debug)]
pub(crate) struct CommandLine {
    pub config: MasterConfig,
    /// Canonical names of the flags given (on the command line, in flagfiles, from the environment).
    pub given: BTreeSet<&'static str>,
    /// `--help…`/`--version` asked for; the text to print.
    pub print: Option<String>,
}

#[derive(Debug, Default)]
struct Parser {
    given: BTreeSet<&'static str>,
    unknown: Vec<String>,
    positional: Vec<String>,
    undefok: BTreeSet<String>,
    help: Option<Option<String>>,
    version: bool,
}

fn flag_error(message: impl Into<String>) -> ConfigError {
    ConfigError::Flags(message.into())
}

impl Parser {
    /// Parses `args` (without the program name) into `config`.
    fn parse(
        &mut self,
        config: &mut MasterConfig,
        args: &[String],
        depth: usize,
    ) -> Result<(), ConfigError> {
        let mut i = 0;
        while i < args.len() {
            let arg = &args[i];
            i += 1;
            let body = match arg.strip_prefix("--").or_else(|| arg.strip_prefix('-')) {
                Some(body) if !body.is_empty() => body,
                _ => {
                    self.positional.push(arg.clone());
                    continue;
                }
            };
            let (raw_name, inline) = match body.split_once('=') {
                Some((n, v)) => (n, Some(v)),
                None => (body, None),
            };
            let name = raw_name.replace('-', "_");
            if name == "h" && inline.is_none() {
                self.help = Some(None);
                continue;
            }
            let spec = match find_flag(&name) {
                Some(spec) => spec,
                None => {
                    // `--noflag` for a boolean flag.
                    let negated = name
                        .strip_prefix("no")
                        .and_then(find_flag)
                        .filter(|s| s.ty == FlagType::Bool);
                    match (negated, inline) {
                        (Some(spec), None) => {
                            self.set(config, spec, "false")?;
                            continue;
                        }
                        (Some(spec), Some(_)) => {
                            return Err(flag_error(format!(
                                "--{name} takes no value (use --{}=VALUE)",
                                spec.name
                            )))
                        }
                        (None, _) => {
                            self.unknown.push(name);
                            // A value given as the next argument cannot be told from a
                            // positional one; gflags refuses unknown flags before that matters.
                            continue;
                        }
                    }
                }
            };
            let value = match (inline, spec.ty) {
                (Some(v), _) => v.to_string(),
                (None, FlagType::Bool) => "true".to_string(),
                (None, _) => match args.get(i) {
                    Some(v) => {
                        i += 1;
                        v.clone()
                    }
                    None => {
                        return Err(flag_error(format!(
                            "--{} is missing its value ({}, e.g. --{}={})",
                            spec.name,
                            spec.ty.name(),
                            spec.name,
                            spec.default_text()
                        )))
                    }
                },
            };
            self.apply(config, spec, &value, depth)?;
        }
        Ok(())
    }

    /// Sets one flag, running the parser-level ones.
    fn apply(
        &mut self,
        config: &mut MasterConfig,
        spec: &'static FlagSpec,
        value: &str,
        depth: usize,
    ) -> Result<(), ConfigError> {
        self.set(config, spec, value)?;
        match spec.name {
            FLAGFILE if !value.is_empty() => self.flagfile(config, Path::new(value), depth)?,
            FROMENV | TRYFROMENV if !value.is_empty() => {
                let required = spec.name == FROMENV;
                for name in value.split(',').map(str::trim).filter(|n| !n.is_empty()) {
                    let Some(target) = find_flag(&name.replace('-', "_")) else {
                        return Err(flag_error(format!(
                            "--{}: unknown flag {name:?}",
                            spec.name
                        )));
                    };
                    if [FLAGFILE, FROMENV, TRYFROMENV].contains(&target.name) {
                        return Err(flag_error(format!(
                            "--{}: {name} cannot be read from the environment",
                            spec.name
                        )));
                    }
                    let var = format!("FLAGS_{name}");
                    match std::env::var(&var) {
                        Ok(v) => self.apply(config, target, &v, depth)?,
                        Err(_) if !required => {}
                        Err(_) => {
                            return Err(flag_error(format!(
                                "--fromenv: {var} is not set in the environment"
                            )))
                        }
                    }
                }
            }
            UNDEFOK => {
                self.undefok.extend(
                    value
                        .split(',')
                        .map(|n| n.trim().replace('-', "_"))
                        .filter(|n| !n.is_empty()),
                );
            }
            "helpmatch" | "helpon" if !value.is_empty() => {
                self.help = Some(Some(value.to_string()));
            }
            name if HELP_FLAGS.contains(&name)
                && config.value_text(name).as_deref() == Some("true") =>
            {
                self.help = Some(None);
            }
            VERSION => self.version = config.version,
            _ => {}
        }
        Ok(())
    }

    fn set(
        &mut self,
        config: &mut MasterConfig,
        spec: &'static FlagSpec,
        value: &str,
    ) -> Result<(), ConfigError> {
        config
            .set_text(spec.name, value)
            .map_err(|message| ConfigError::Invalid {
                flag: spec.name,
                message,
            })?;
        self.given.insert(spec.name);
        Ok(())
    }

    fn flagfile(
        &mut self,
        config: &mut MasterConfig,
        path: &Path,
        depth: usize,
    ) -> Result<(), ConfigError> {
        if depth >= MAX_FLAGFILE_DEPTH {
            return Err(flag_error(format!(
                "--flagfile {}: nested more than {MAX_FLAGFILE_DEPTH} deep",
                path.display()
            )));
        }
        let text = read_bounded(path)?;
        let mut args = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if !line.starts_with('-') {
                return Err(ConfigError::Parse {
                    path: path.to_path_buf(),
                    message: format!(
                        "line {}: {line:?} is not a flag (one --name=value per line)",
                        n + 1
                    ),
                });
            }
            args.push(line.to_string());
        }
        self.parse(config, &args, depth + 1)
    }
}

fn read_bounded(path: &Path) -> Result<String, ConfigError> {
    let read_error = |source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    };
    let len = std::fs::metadata(path).map_err(read_error)?.len();
    if len > MAX_CONFIG_FILE_BYTES {
        return Err(ConfigError::Parse {
            path: path.to_path_buf(),
            message: format!("{len} bytes is more than the {MAX_CONFIG_FILE_BYTES}-byte limit"),
        });
    }
    std::fs::read_to_string(path).map_err(read_error)
}

/// Parses the command line (program name first).
pub(crate) fn parse_command_line(args: &[String]) -> Result<CommandLine, ConfigError> {
    let mut config = MasterConfig::default();
    let mut parser = Parser::default();
    parser.parse(&mut config, args.get(1..).unwrap_or_default(), 0)?;
    let unknown: Vec<&String> = parser
        .unknown
        .iter()
        .filter(|n| !parser.undefok.contains(n.as_str()))
        .collect();
    if !unknown.is_empty() {
        let names: Vec<String> = unknown.iter().map(|n| format!("--{n}")).collect();
        return Err(flag_error(format!(
            "unknown command line flag{} {} (mooncake master --help lists every flag)",
            if names.len() > 1 { "s" } else { "" },
            names.join(", ")
        )));
    }
    if let Some(arg) = parser.positional.first() {
        return Err(flag_error(format!(
            "unexpected argument {arg:?}: flags are --name=value, and booleans take their \
             value only after '=' (--enable_ha=false)"
        )));
    }
    let print = match (&parser.help, parser.version) {
        (Some(filter), _) => Some(help_text(filter.as_deref())),
        (None, true) => Some(version_text()),
        (None, false) => None,
    };
    Ok(CommandLine {
        config,
        given: parser.given,
        print,
    })
}

/// The values a config file gives, as flag text, and the keys that are not flags.
#[derive(Debug, Default)]
pub(crate) struct FileValues {
    /// (canonical flag name, key as written, value text)
    pub values: Vec<(&'static FlagSpec, String, String)>,
    pub unknown_keys: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FileFormat {
    Yaml,
    Json,
    Toml,
}

fn file_format(path: &Path) -> Result<FileFormat, ConfigError> {
    match path.extension().and_then(|e| e.to_str()) {
        Some("yaml" | "yml") => Ok(FileFormat::Yaml),
        Some("json") => Ok(FileFormat::Json),
        Some("toml") => Ok(FileFormat::Toml),
        _ => Err(ConfigError::Parse {
            path: path.to_path_buf(),
            message: "unsupported config file format (use .yaml, .yml, .json or .toml)".into(),
        }),
    }
}

/// A scalar of a config file, as flag text.
enum Scalar {
    Text(String),
    Null,
    List,
}

fn yaml_entries(
    value: &serde_yaml::Value,
    prefix: &str,
    out: &mut Vec<(String, Scalar)>,
) -> Result<(), String> {
    use serde_yaml::Value as Y;
    match value {
        Y::Mapping(map) => {
            for (k, v) in map {
                let key = match k {
                    Y::String(s) => s.clone(),
                    Y::Number(n) => n.to_string(),
                    Y::Bool(b) => b.to_string(),
                    _ => return Err(format!("a key under {prefix:?} is not a scalar")),
                };
                let key = if prefix.is_empty() {
                    key
                } else {
                    format!("{prefix}.{key}")
                };
                if matches!(v, Y::Mapping(_)) {
                    yaml_entries(v, &key, out)?;
                } else {
                    out.push((key, yaml_scalar(v)));
                }
            }
            Ok(())
        }
        Y::Null if prefix.is_empty() => Ok(()),
        _ => Err("the top level is not a map of key: value".into()),
    }
}

fn yaml_scalar(value: &serde_yaml::Value) -> Scalar {
    use serde_yaml::Value as Y;
    match value {
        Y::Bool(b) => Scalar::Text(b.to_string()),
        Y::Number(n) => Scalar::Text(n.to_string()),
        Y::String(s) => Scalar::Text(s.clone()),
        Y::Null => Scalar::Null,
        Y::Tagged(t) => yaml_scalar(&t.value),
        Y::Sequence(_) | Y::Mapping(_) => Scalar::List,
    }
}

fn json_entries(
    value: &serde_json::Value,
    prefix: &str,
    out: &mut Vec<(String, Scalar)>,
) -> Result<(), String> {
    use serde_json::Value as J;
    let J::Object(map) = value else {
        return Err("the top level is not an object of \"key\": value".into());
    };
    for (k, v) in map {
        let key = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        match v {
            J::Object(_) => json_entries(v, &key, out)?,
            J::Bool(b) => out.push((key, Scalar::Text(b.to_string()))),
            J::Number(n) => out.push((key, Scalar::Text(n.to_string()))),
            J::String(s) => out.push((key, Scalar::Text(s.clone()))),
            J::Null => out.push((key, Scalar::Null)),
            J::Array(_) => out.push((key, Scalar::List)),
        }
    }
    Ok(())
}

fn toml_entries(value: &toml::Table, out: &mut Vec<(String, Scalar)>) {
    use toml::Value as T;
    for (k, v) in value {
        let scalar = match v {
            T::String(s) => Scalar::Text(s.clone()),
            T::Integer(i) => Scalar::Text(i.to_string()),
            T::Float(f) => Scalar::Text(f.to_string()),
            T::Boolean(b) => Scalar::Text(b.to_string()),
            T::Datetime(d) => Scalar::Text(d.to_string()),
            T::Array(_) | T::Table(_) => Scalar::List,
        };
        out.push((k.clone(), scalar));
    }
}

/// Reads a config file into flag values. Parse errors name the file and, where one is at fault,
/// the key.
pub(crate) fn read_config_file(path: &Path) -> Result<FileValues, ConfigError> {
    let format = file_format(path)?;
    let text = read_bounded(path)?;
    let parse_error = |message: String| ConfigError::Parse {
        path: path.to_path_buf(),
        message,
    };
    let mut entries = Vec::new();
    match format {
        FileFormat::Yaml => {
            let value: serde_yaml::Value = serde_yaml::from_str(&text)
                .map_err(|e| parse_error(format!("invalid YAML: {e}")))?;
            yaml_entries(&value, "", &mut entries).map_err(parse_error)?;
        }
        FileFormat::Json => {
            let value: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| parse_error(format!("invalid JSON: {e}")))?;
            json_entries(&value, "", &mut entries).map_err(parse_error)?;
        }
        FileFormat::Toml => {
            let value: toml::Table =
                toml::from_str(&text).map_err(|e| parse_error(format!("invalid TOML: {e}")))?;
            toml_entries(&value, &mut entries);
        }
    }
    let mut out = FileValues::default();
    let mut seen: BTreeMap<&'static str, String> = BTreeMap::new();
    for (key, scalar) in entries {
        let Some(spec) = find_flag(&key.replace('-', "_")) else {
            if format == FileFormat::Toml {
                return Err(parse_error(format!(
                    "key `{key}` is not a flag (mooncake master --help lists them)"
                )));
            }
            out.unknown_keys.push(key);
            continue;
        };
        let text = match scalar {
            Scalar::Text(t) => t,
            Scalar::Null => return Err(parse_error(format!("key `{key}` has no value"))),
            Scalar::List => {
                return Err(parse_error(format!(
                    "key `{key}`: a list or table is not a flag value"
                )))
            }
        };
        if let Some(first) = seen.insert(spec.name, key.clone()) {
            return Err(parse_error(format!(
                "keys `{first}` and `{key}` both set {}",
                spec.name
            )));
        }
        out.values.push((spec, key, text));
    }
    Ok(out)
}

/// Applies a file's values to `config` for every flag the command line did not give.
pub(crate) fn apply_file(
    config: &mut MasterConfig,
    path: &Path,
    file: &FileValues,
    given: &BTreeSet<&'static str>,
) -> Result<Vec<&'static str>, ConfigError> {
    let mut applied = Vec::new();
    for (spec, key, text) in &file.values {
        let error = |message: String| ConfigError::Parse {
            path: path.to_path_buf(),
            message: format!("key `{key}`: {message}"),
        };
        if file_may_not_set(spec.name) {
            let mut probe = MasterConfig::default();
            probe.set_text(spec.name, text).map_err(error)?;
            if !probe.is_default(spec.name) {
                return Err(error(format!(
                    "{} can only be given on the command line",
                    spec.name
                )));
            }
            continue;
        }
        if given.contains(spec.name) {
            // The command line wins; still check the file's value is well-formed.
            let mut probe = MasterConfig::default();
            probe.set_text(spec.name, text).map_err(error)?;
            continue;
        }
        config.set_text(spec.name, text).map_err(error)?;
        applied.push(spec.name);
    }
    Ok(applied)
}

/// The one start-up warning line: flags given that have no effect in mooncake-rs, grouped by
/// feature, and config-file keys that are not flags.
pub(crate) fn notice(
    config: &MasterConfig,
    given: &BTreeSet<&'static str>,
    file: Option<(&PathBuf, &FileValues)>,
) -> Option<String> {
    let mut by_feature: BTreeMap<&'static str, Vec<String>> = BTreeMap::new();
    for spec in FLAGS.iter() {
        let feature = match spec.status {
            Status::Honoured => continue,
            Status::Refused(f) | Status::Inert(f) => f,
        };
        if !given.contains(spec.name) && config.is_default(spec.name) {
            continue;
        }
        let entry = if config.is_default(spec.name) {
            spec.name.to_string()
        } else {
            let value = config.value_text(spec.name).unwrap_or_default();
            format!("{}={value:?}", spec.name)
        };
        by_feature.entry(feature).or_default().push(entry);
    }
    let mut parts = Vec::new();
    if !by_feature.is_empty() {
        let groups: Vec<String> = by_feature
            .into_iter()
            .map(|(feature, names)| format!("{feature}: {}", names.join(", ")))
            .collect();
        parts.push(format!(
            "flags accepted without effect (features mooncake-rs does not build) - {}",
            groups.join("; ")
        ));
    }
    if let Some((path, values)) = file {
        if !values.unknown_keys.is_empty() {
            parts.push(format!(
                "keys of {} that are not flags, ignored: {}",
                path.display(),
                values.unknown_keys.join(", ")
            ));
        }
    }
    (!parts.is_empty()).then(|| parts.join(" | "))
}

/// `mooncake master --version`.
pub fn version_text() -> String {
    format!(
        "mooncake master (mooncake-rs {})\n",
        env!("CARGO_PKG_VERSION")
    )
}

/// `mooncake master --help`: every flag with its type, default and status; `filter` keeps the
/// flags whose name contains it (`--helpmatch`, `--helpon`).
pub fn help_text(filter: Option<&str>) -> String {
    use std::fmt::Write as _;
    let mut out = String::from(
        "Usage: mooncake master [--flag=value ...] [--config_path FILE.yaml|.json|.toml]\n\n\
         Run the mooncake-rs master (metadata service). Flags are upstream mooncake_master's \
         (gflags syntax: -name or --name, =value or a following argument, --noname for booleans).\n",
    );
    type Keep = fn(&FlagSpec) -> bool;
    let sections: [(&str, Keep); 4] = [
        ("Flags mooncake-rs honours", |f| {
            f.status == Status::Honoured && f.origin != Origin::Ours
        }),
        ("Flags of mooncake-rs only", |f| f.origin == Origin::Ours),
        (
            "Accepted at their default only (the feature is not built)",
            |f| matches!(f.status, Status::Refused(_)),
        ),
        (
            "Accepted without effect (settings of features not built)",
            |f| matches!(f.status, Status::Inert(_)),
        ),
    ];
    for (title, keep) in sections {
        let flags: Vec<&FlagSpec> = FLAGS
            .iter()
            .filter(|f| keep(f))
            .filter(|f| filter.is_none_or(|s| f.name.contains(s)))
            .collect();
        if flags.is_empty() {
            continue;
        }
        let _ = writeln!(out, "\n{title}:");
        for f in flags {
            let feature = match f.status {
                Status::Refused(feature) | Status::Inert(feature) => format!(" [{feature}]"),
                Status::Honoured => String::new(),
            };
            let aliases = if f.aliases.is_empty() {
                String::new()
            } else {
                format!(" (also --{})", f.aliases.join(", --"))
            };
            let _ = writeln!(
                out,
                "  --{}{aliases} ({}, default {:?}){feature}\n      {}",
                f.name,
                f.ty.name(),
                f.default_text(),
                f.help
            );
        }
    }
    out
}

/// The flag table as Markdown (docs/master-server.md carries it between markers; a test keeps
/// the two equal).
pub fn flag_table_markdown() -> String {
    use std::fmt::Write as _;
    let mut out = String::from("| flag | type | default | mooncake-rs |\n|---|---|---|---|\n");
    for f in FLAGS.iter() {
        let status = match (f.status, f.origin) {
            (Status::Honoured, Origin::Ours) => "honoured (ours; not upstream)".to_string(),
            (Status::Honoured, _) => "honoured".to_string(),
            (Status::Refused(feature), _) => {
                format!("default only; other values refused ({feature})")
            }
            (Status::Inert(feature), _) => format!("accepted, no effect ({feature})"),
        };
        let name = if f.aliases.is_empty() {
            format!("`{}`", f.name)
        } else {
            format!("`{}` (`{}`)", f.name, f.aliases.join("`, `"))
        };
        let default = match f.default_text() {
            "" => "\"\"".to_string(),
            d => format!("`{d}`"),
        };
        let _ = writeln!(out, "| {name} | {} | {default} | {status} |", f.ty.name());
    }
    out
}
