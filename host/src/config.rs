//! The host's configuration: the settings each capability declares beside its code, gathered
//! into one [`Config`]. Flags override environment variables, which override defaults.
//!
//! The environment is read, never written: each variable a setting names is read once, its
//! value trimmed (an empty one counts as unset), and handed to the parser as if its flag had
//! been typed, unless the flag was.

use std::ffi::OsString;

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{Arg, Command, CommandFactory, FromArgMatches, Parser};

use crate::edge::settings::EdgeSettings;
use crate::error::Error;
use crate::observability::routes::HostPage;
use crate::observability::settings::{self, Env, TelemetryArgs, TelemetrySettings};
use crate::runtime::settings::GuestSettings;
use crate::user_store::StoreChoice;
use crate::user_store::settings::StoreSettings;

/// The rule every value follows, said once under `--help`.
const VALUE_RULE: &str = "\
Every setting above is a flag and an environment variable (shown as [env: NAME=]); a flag wins \
over its variable. Every value is trimmed; an empty one counts as unset.";

/// What `--help` says after the flags: the rule for values, then the OpenTelemetry variables,
/// which have no flags.
fn after_help() -> String {
    format!("{VALUE_RULE}\n\n{}", settings::variables_help())
}

/// Serves the tutorial service's guest component over HTTP.
#[derive(Debug, Clone, Parser)]
// allow_negative_numbers: `--max-body-bytes -5` is a bad value of that flag, not a stray flag.
#[command(name = "host", version, about, after_help = after_help(), allow_negative_numbers = true)]
pub struct Config {
    /// Which guest serves, and what its instances may use.
    #[command(flatten)]
    pub runtime: GuestSettings,
    /// Where the host listens, and what a client may use.
    #[command(flatten)]
    pub edge: EdgeSettings,
    /// Where users are kept.
    #[command(flatten)]
    pub users: StoreSettings,
    /// Where log lines and spans go.
    #[command(flatten)]
    pub telemetry: TelemetryArgs,
    /// The flags whose values came from variables, so that errors name what the user set.
    #[arg(skip)]
    from_variables: FromVariables,
}

/// Why no configuration came of the command line: help or the version was asked for (a
/// message for stdout, and success), or a value is wrong (a message for stderr, and exit 2).
#[derive(Debug)]
pub struct NotRead {
    /// What to print.
    pub message: String,
    /// Whether it is an error.
    pub is_error: bool,
}

impl Config {
    /// Reads the configuration from `args` (the command line, program name first) and the
    /// variables `var` gives, then the defaults.
    pub fn read(
        args: impl IntoIterator<Item = OsString>,
        var: impl Fn(&str) -> Option<OsString>,
    ) -> Result<Config, NotRead> {
        let shown = Config::command();
        let typed = normalized_args(args);
        let (args, from_variables, bad_variable) = with_variables(&shown, typed, var);
        // Parsed without clap's own reading of the environment: every variable is in `args`.
        let parser = shown.clone().mut_args(|arg| arg.env(None::<&'static str>));
        let matches = match parser.try_get_matches_from(&args) {
            Ok(matches) => matches,
            Err(error) if error.kind() == ErrorKind::DisplayVersion => {
                return Err(NotRead {
                    message: error.render().to_string(),
                    is_error: false,
                });
            }
            Err(error) if error.kind() == ErrorKind::DisplayHelp => {
                // Rendered from the command that shows each flag's variable.
                let mut shown = shown;
                let help = if args.iter().any(|arg| arg == "--help") {
                    shown.render_long_help()
                } else {
                    shown.render_help()
                };
                return Err(NotRead {
                    message: help.to_string(),
                    is_error: false,
                });
            }
            Err(_) if bad_variable.is_some() => return Err(bad_variable.expect("checked")),
            Err(error) => return Err(explain(error, &from_variables)),
        };
        if let Some(bad) = bad_variable {
            return Err(bad);
        }
        let mut config =
            Config::from_arg_matches(&matches).map_err(|error| explain(error, &from_variables))?;
        config.from_variables = from_variables;
        if let Some((first, second, path)) = config.edge.host_pages().shared_path() {
            let [first, second] = [first, second].map(|page| config.named(page_flag(page)));
            return Err(NotRead {
                message: format!(
                    "error: {first} and {second} both name {path}: each of the host's pages needs a \
                     path of its own\n"
                ),
                is_error: true,
            });
        }
        Ok(config)
    }

    /// The store the settings name; an error names the flag or the variable that was set.
    pub fn store_choice(&self) -> Result<StoreChoice, Error> {
        self.users
            .choice(self.runtime.request_timeout())
            .map_err(|reason| Error::StoreSetting {
                setting: self.named(self.users.chosen_flag()),
                reason,
            })
    }

    /// `flag`, or the variable its value came from.
    fn named(&self, flag: &str) -> String {
        self.from_variables
            .iter()
            .find(|(from, _)| from == flag)
            .map_or(flag, |(_, variable)| variable)
            .to_string()
    }

    /// Where log lines and spans go, once the OpenTelemetry variables `var` gives are checked.
    pub fn telemetry(&self, var: Env) -> Result<TelemetrySettings, Error> {
        self.telemetry.settings(var)
    }
}

/// The flag that places `page`.
fn page_flag(page: HostPage) -> &'static str {
    match page {
        HostPage::Metrics => "--metrics-path",
        HostPage::Live => "--live-path",
        HostPage::Ready => "--ready-path",
    }
}

/// Every environment variable the host or the OpenTelemetry SDK reads: one per setting.
pub fn variables() -> Vec<String> {
    let command = Config::command();
    let mut names: Vec<String> = command
        .get_arguments()
        .filter_map(Arg::get_env)
        .filter_map(|name| name.to_str().map(str::to_string))
        .chain(settings::variables().map(str::to_string))
        .collect();
    names.sort();
    names
}

/// Applies the one rule for values to the command line: a flag's value is trimmed, and a flag
/// whose value is empty is dropped, so it counts as unset (the variable, then the default).
pub fn normalized_args(args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    let flags = Config::command();
    let takes_value = |name: &str| {
        flags
            .get_arguments()
            .any(|arg| arg.get_long() == Some(name) && arg.get_action().takes_values())
    };
    let mut args = args.into_iter();
    let mut normalized: Vec<OsString> = args.next().into_iter().collect();
    while let Some(arg) = args.next() {
        let Some(flag) = arg.to_str().and_then(|text| text.strip_prefix("--")) else {
            normalized.push(arg);
            continue;
        };
        if let Some((name, value)) = flag.split_once('=') {
            let value = value.trim();
            if !value.is_empty() {
                normalized.push(format!("--{name}={value}").into());
            }
        } else if takes_value(flag) {
            match args.next() {
                Some(value) => match value.to_str().map(str::trim) {
                    Some("") => {}
                    Some(text) => normalized.extend([arg.clone(), text.into()]),
                    None => normalized.extend([arg.clone(), value]),
                },
                None => normalized.push(arg),
            }
        } else {
            normalized.push(arg);
        }
    }
    normalized
}

/// The flags whose values came from variables, each with its variable: `(--port, PORT)`.
type FromVariables = Vec<(String, String)>;

/// `args` with, for each flag not typed whose variable `var` gives a value, that value as if
/// typed; those flags with their variables, for the errors; and the first variable that cannot
/// be a value at all (a switch's that says neither true nor false, or text that is not UTF-8),
/// said after `--help` and `--version` have had their turn. A switch's variable (say
/// `GUEST_WATCH=yes`) sets the switch when it says true.
fn with_variables(
    command: &Command,
    mut args: Vec<OsString>,
    var: impl Fn(&str) -> Option<OsString>,
) -> (Vec<OsString>, FromVariables, Option<NotRead>) {
    let mut from_variables = Vec::new();
    let mut bad_variable = None;
    for arg in command.get_arguments() {
        let (Some(variable), Some(long)) =
            (arg.get_env().and_then(|name| name.to_str()), arg.get_long())
        else {
            continue;
        };
        let flag = format!("--{long}");
        let typed = args.iter().any(|typed| {
            typed
                .to_str()
                .is_some_and(|typed| typed == flag || typed.starts_with(&format!("{flag}=")))
        });
        let Some(value) = var(variable).filter(|_| !typed) else {
            continue;
        };
        let value = match value.to_str() {
            Some(text) if text.trim().is_empty() => continue,
            Some(text) => OsString::from(text.trim()),
            // A path may be any bytes; every other value is text.
            None if arg.get_value_hint() == clap::ValueHint::AnyPath => value,
            None => {
                bad_variable.get_or_insert_with(|| refused(variable, "not UTF-8 text"));
                continue;
            }
        };
        from_variables.push((flag.clone(), variable.to_string()));
        if arg.get_action().takes_values() {
            let mut assigned = OsString::from(format!("{flag}="));
            assigned.push(&value);
            args.push(assigned);
        } else {
            match switched_on(&value) {
                Some(true) => args.push(flag.into()),
                Some(false) => {}
                None => {
                    bad_variable.get_or_insert_with(|| refused(variable, "expected true or false"));
                }
            }
        }
    }
    (args, from_variables, bad_variable)
}

/// The error for a variable whose value cannot be read.
fn refused(variable: &str, reason: &str) -> NotRead {
    NotRead {
        message: format!("error: invalid value for {variable}: {reason}\n"),
        is_error: true,
    }
}

/// Whether a switch's variable says on, in the words clap takes for true and false; `None`
/// when it says neither.
fn switched_on(value: &OsString) -> Option<bool> {
    let value = value.to_str().unwrap_or_default().to_ascii_lowercase();
    match value.as_str() {
        "y" | "yes" | "t" | "true" | "on" | "1" => Some(true),
        "n" | "no" | "f" | "false" | "off" | "0" => Some(false),
        _ => None,
    }
}

/// The message for `error`: clap's own, except that a bad value which came from an environment
/// variable is said to come from that variable (clap names the flag).
fn explain(error: clap::Error, from_variables: &FromVariables) -> NotRead {
    let mut message = error.render().to_string();
    if let Some(ContextValue::String(named)) = error.get(ContextKind::InvalidArg) {
        let variable = from_variables.iter().find(|(flag, _)| {
            named == flag
                || named.starts_with(&format!("{flag} "))
                || named.starts_with(&format!("{flag}="))
        });
        if let Some((_, variable)) = variable {
            message = message.replace(&format!("'{named}'"), variable);
        }
    }
    NotRead {
        message,
        is_error: true,
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::path::PathBuf;
    use std::time::Duration;

    use super::*;
    use crate::observability::settings::{
        DEFAULT_JAEGER_AGENT_HOST, DEFAULT_JAEGER_AGENT_PORT, DEFAULT_SERVICE_NAME, SpanExport,
    };
    use crate::runtime::GuestLimits;
    use crate::runtime::ProbePath;
    use crate::runtime::settings::DEFAULT_PROBE_PATH;
    use crate::user_store::settings::{MAX_STORE_CALL_TIMEOUT, store_call_timeout};

    fn args(list: &[&str]) -> Vec<OsString> {
        list.iter().map(OsString::from).collect()
    }

    /// An environment of the variables `pairs`, and nothing else.
    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> + use<> {
        let pairs: Vec<(String, OsString)> = pairs
            .iter()
            .map(|(name, value)| (name.to_string(), OsString::from(value)))
            .collect();
        move |name| {
            pairs
                .iter()
                .find(|(key, _)| key == name)
                .map(|(_, value)| value.clone())
        }
    }

    /// The configuration of `flags` and of the variables `pairs`, and nothing else.
    fn read(flags: &[&str], pairs: &[(&str, &str)]) -> Result<Config, NotRead> {
        let command_line = std::iter::once("host").chain(flags.iter().copied());
        Config::read(args(&command_line.collect::<Vec<_>>()), env(pairs))
    }

    fn flags(flags: &[&str]) -> Config {
        read(flags, &[]).unwrap()
    }

    #[test]
    fn defaults_follow_the_contract() {
        let config = flags(&[]);
        assert_eq!(config.edge.listen_addr().to_string(), "0.0.0.0:8080");
        assert!(
            config
                .runtime
                .guest
                .ends_with("target/wasm32-wasip2/release/guest.wasm")
        );
        assert_eq!(config.edge.max_body_bytes, 1_048_576);
        assert_eq!(config.runtime.request_timeout_ms, 10_000);
        assert_eq!(config.runtime.guest_memory_mb, 128);
        assert_eq!(config.telemetry.log_file, PathBuf::from("logs/app.log"));
        assert!(!config.runtime.watch);
    }

    #[test]
    fn the_default_guest_limits_are_those_of_a_host_started_without_flags() {
        let (read, default) = (flags(&[]).runtime.limits(), GuestLimits::default());
        assert_eq!(read.request_timeout, default.request_timeout);
        assert_eq!(read.memory_bytes, default.memory_bytes);
        assert_eq!(read.memory_budget_bytes, default.memory_budget_bytes);
        assert_eq!(read.max_instances, default.max_instances);
        assert_eq!(read.max_streaming, default.max_streaming);
    }

    #[test]
    fn flags_set_every_value() {
        let config = flags(&[
            "--guest",
            "g.wasm",
            "--port",
            "9000",
            "--bind",
            "127.0.0.1",
            "--watch",
            "--max-body-bytes",
            "10",
            "--max-users",
            "3",
            "--max-store-mb",
            "5",
        ]);
        assert_eq!(config.runtime.guest, PathBuf::from("g.wasm"));
        assert_eq!(config.edge.listen_addr().to_string(), "127.0.0.1:9000");
        assert!(config.runtime.watch);
        assert_eq!(config.edge.max_body_bytes, 10);
        assert_eq!(config.users.max_users, 3);
        assert_eq!(config.users.max_store_bytes(), 5 << 20);
    }

    #[test]
    fn variables_set_values_trimmed_and_a_flag_wins_over_its_variable() {
        let pairs = [
            ("PORT", "9000"),
            ("BIND", " 127.0.0.1 "),
            ("GUEST_WATCH", "yes"),
            ("OTEL_TRACES_EXPORTER", " none "),
            ("OTEL_SERVICE_NAME", ""),
        ];
        let config = read(&["--port", "9001"], &pairs).unwrap();
        assert_eq!(
            config.edge.listen_addr(),
            "127.0.0.1:9001".parse::<SocketAddr>().unwrap()
        );
        assert!(config.runtime.watch);
        let telemetry = config.telemetry(&env(&pairs)).unwrap();
        assert_eq!(telemetry.export, SpanExport::Off);
        assert_eq!(telemetry.service_name, DEFAULT_SERVICE_NAME);
        let off = read(&[], &[("GUEST_WATCH", "false")]).unwrap();
        assert!(!off.runtime.watch);
    }

    #[test]
    fn the_store_is_memory_unless_a_postgres_url_is_given() {
        let memory = flags(&["--store", "memory"]);
        assert!(matches!(
            memory.store_choice(),
            Ok(StoreChoice::Memory { .. })
        ));
        let url = "postgres://app:hunter2@db:5432/users";
        let postgres = flags(&["--store", url, "--store-pool-size", "3"]);
        let Ok(StoreChoice::Postgres(settings)) = postgres.store_choice() else {
            panic!("a postgres URL chooses PostgreSQL");
        };
        assert_eq!(settings.pool_size, 3);
        assert!(!format!("{postgres:?} {settings:?}").contains("hunter2"));
        let from_database_url = read(&[], &[("DATABASE_URL", url)]).unwrap();
        assert!(matches!(
            from_database_url.store_choice(),
            Ok(StoreChoice::Postgres(_))
        ));
        let store_wins = read(&[], &[("DATABASE_URL", url), ("USER_STORE", "memory")]).unwrap();
        assert!(matches!(
            store_wins.store_choice(),
            Ok(StoreChoice::Memory { .. })
        ));
    }

    #[test]
    fn a_bad_store_setting_is_an_error_that_does_not_repeat_it() {
        for setting in [
            "memroy",
            "mysql://u:hunter2@db/x",
            "postgres://u:hunter2@db:x/y",
        ] {
            let config = flags(&["--store", setting]);
            let error = config.store_choice().err().expect(setting).to_string();
            assert!(!error.contains("hunter2"), "{error}");
        }
    }

    #[test]
    fn a_bad_store_setting_is_named_by_the_flag_or_the_variable_that_was_set() {
        let named = |config: Config| config.store_choice().err().unwrap().to_string();
        let by_flag = named(flags(&["--store", "memroy"]));
        assert!(
            by_flag.starts_with("invalid --store: expected"),
            "{by_flag}"
        );
        let by_variable = named(read(&[], &[("USER_STORE", "memroy")]).unwrap());
        assert!(
            by_variable.starts_with("invalid USER_STORE: "),
            "{by_variable}"
        );
        let by_url = named(read(&[], &[("DATABASE_URL", "mysql://db/x")]).unwrap());
        assert!(by_url.starts_with("invalid DATABASE_URL: "), "{by_url}");
        let by_url_flag = named(flags(&["--database-url", "postgres://"]));
        assert!(
            by_url_flag.starts_with("invalid --database-url: "),
            "{by_url_flag}"
        );
    }

    #[test]
    fn telemetry_settings_treat_empty_as_unset_and_refuse_a_bad_port() {
        let config = flags(&[
            "--service-name",
            "",
            "--jaeger-agent-host",
            "",
            "--jaeger-agent-port",
            "",
        ]);
        let settings = config.telemetry(&env(&[])).unwrap();
        assert_eq!(settings.service_name, DEFAULT_SERVICE_NAME);
        assert_eq!(
            settings.export,
            SpanExport::JaegerAgent {
                host: DEFAULT_JAEGER_AGENT_HOST.to_string(),
                port: DEFAULT_JAEGER_AGENT_PORT,
            }
        );
        assert!(settings.resource_attributes.is_empty());
        let set = flags(&[
            "--service-name",
            "svc",
            "--jaeger-agent-host",
            "agent",
            "--jaeger-agent-port",
            "7000",
        ]);
        let settings = set.telemetry(&env(&[])).unwrap();
        assert_eq!(settings.service_name, "svc");
        assert_eq!(
            settings.export,
            SpanExport::JaegerAgent {
                host: "agent".to_string(),
                port: 7000
            }
        );
        for bad in ["0", "65536", "x"] {
            assert!(read(&["--jaeger-agent-port", bad], &[]).is_err());
        }
    }

    #[test]
    fn the_probe_path_is_a_path_off_or_when_empty_the_default() {
        let probe = |value: &str| {
            read(&[&format!("--probe-path={value}")], &[]).map(|config| config.runtime.probe_path)
        };
        assert_eq!(probe("off").unwrap(), ProbePath::Off);
        assert_eq!(
            probe("").unwrap(),
            ProbePath::Get(DEFAULT_PROBE_PATH.parse().unwrap())
        );
        assert_eq!(
            probe("/ready?deep=1").unwrap(),
            ProbePath::Get("/ready?deep=1".parse().unwrap())
        );
        assert!(probe("ready").is_err());
    }

    #[test]
    fn store_calls_end_well_within_the_request_deadline() {
        assert_eq!(
            store_call_timeout(flags(&[]).runtime.request_timeout()),
            MAX_STORE_CALL_TIMEOUT
        );
        let short = flags(&["--request-timeout-ms", "1000"]);
        assert_eq!(
            store_call_timeout(short.runtime.request_timeout()),
            Duration::from_millis(500)
        );
    }

    #[test]
    fn invalid_values_are_refused_before_binding() {
        for bad in [
            &["--port", "70000"][..],
            &["--bind", "nowhere"],
            &["--request-timeout-ms", "0"],
            &["--store-pool-size", "0"],
        ] {
            let refused = read(bad, &[]).unwrap_err();
            assert!(refused.is_error, "{bad:?}");
        }
    }

    #[test]
    fn a_negative_number_is_refused_as_a_bad_value_of_its_flag() {
        let refused = read(&["--max-body-bytes", "-5"], &[]).unwrap_err();
        assert!(refused.is_error);
        assert!(
            refused
                .message
                .contains("invalid value '-5' for '--max-body-bytes"),
            "{}",
            refused.message
        );
    }

    #[test]
    fn a_flags_value_is_trimmed_and_an_empty_one_counts_as_unset() {
        let normalized = normalized_args(args(&[
            "host",
            "--port",
            " 9090 ",
            "--service-name",
            "  ",
            "--bind= 127.0.0.1",
            "--jaeger-agent-port=",
            "--watch",
        ]));
        assert_eq!(
            normalized,
            args(&["host", "--port", "9090", "--bind=127.0.0.1", "--watch"])
        );
        let config = read(
            &[
                "--port",
                " 9090 ",
                "--service-name",
                "  ",
                "--bind= 127.0.0.1",
            ],
            &[],
        )
        .unwrap();
        assert_eq!(config.edge.listen_addr().to_string(), "127.0.0.1:9090");
        assert_eq!(config.telemetry.service_name, None);
    }

    #[test]
    fn a_bad_value_is_named_by_the_flag_typed_or_by_its_variable() {
        let typed = read(&["--jaeger-agent-port", "abc"], &[]).unwrap_err();
        assert!(
            typed.message.contains("--jaeger-agent-port"),
            "{}",
            typed.message
        );
        let from_variable = read(&[], &[("OTEL_EXPORTER_JAEGER_AGENT_PORT", "abc")]).unwrap_err();
        assert!(
            from_variable
                .message
                .contains("OTEL_EXPORTER_JAEGER_AGENT_PORT"),
            "{}",
            from_variable.message
        );
        let switch = read(&[], &[("GUEST_WATCH", "perhaps")]).unwrap_err();
        assert!(switch.message.contains("GUEST_WATCH"), "{}", switch.message);
        // Help is still help.
        assert!(
            !read(&["--help"], &[("GUEST_WATCH", "perhaps")])
                .unwrap_err()
                .is_error
        );
    }

    #[test]
    fn version_is_no_error_and_variables_that_are_not_text_are_named() {
        let version = read(&["--version"], &[]).unwrap_err();
        assert!(!version.is_error && version.message.contains(env!("CARGO_PKG_VERSION")));
        use std::os::unix::ffi::OsStringExt;
        let not_text = OsString::from_vec(vec![0xff, 0xfe]);
        let refused = Config::read(args(&["host"]), |name| {
            (name == "OTEL_SERVICE_NAME").then(|| not_text.clone())
        })
        .unwrap_err();
        assert!(
            refused.message.contains("OTEL_SERVICE_NAME"),
            "{}",
            refused.message
        );
    }

    #[test]
    fn help_lists_every_variable_and_is_no_error() {
        let help = read(&["--help"], &[]).unwrap_err();
        assert!(!help.is_error);
        for variable in variables() {
            assert!(
                help.message.contains(&variable),
                "--help does not list {variable}"
            );
        }
        for variable in [
            "OTEL_SERVICE_NAME",
            "OTEL_BSP_MAX_QUEUE_SIZE",
            "RUST_LOG",
            "DATABASE_URL",
        ] {
            assert!(
                variables().iter().any(|listed| listed == variable),
                "{variable}"
            );
        }
    }
}
