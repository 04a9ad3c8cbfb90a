//! Where a command lists its flags in `--help`.
//!
//! The flags several commands share live in flattened structs ([`crate::engine_args`],
//! [`crate::session_args`], [`crate::ranks`]), and clap lists a flattened struct's flags
//! together, where it is flattened. A command that mixes them with its own (`generate`'s
//! `--policy` sits beside `--kv-budget`, not beside `--model`) names its order once, as a
//! list of flag ids applied after clap built the command
//! (`#[command(mut_args(|arg| place(arg, &ORDER)))]`); each command's unit test holds that
//! its list names every flag it has, in the order `--help` shows.

use clap::Arg;

/// `arg` placed at its position in `order` (clap sorts flags by that number, then by
/// name); a flag `order` does not name goes after all that it does.
pub fn place(arg: Arg, order: &[&str]) -> Arg {
    let position = order.iter().position(|id| arg.get_id() == *id);
    let slot = position.unwrap_or(order.len() + arg.get_display_order());
    arg.display_order(slot)
}

/// The ids of the flags of the command at `path` (`["bench", "session"]`), in the order
/// its `--help` lists them: what a command's order list is checked against.
#[cfg(test)]
pub fn listed(path: &[&str]) -> Vec<String> {
    use clap::CommandFactory;
    let mut command = crate::Cli::command();
    command.build();
    let mut current = &command;
    for name in path {
        current = current
            .find_subcommand(name)
            .unwrap_or_else(|| panic!("no subcommand {name}"));
    }
    let mut args: Vec<_> = current
        .get_arguments()
        .filter(|a| !a.is_global_set() && !matches!(a.get_id().as_str(), "help" | "version"))
        .map(|a| (a.get_display_order(), a.get_id().to_string()))
        .collect();
    args.sort();
    args.into_iter().map(|(_, id)| id).collect()
}
