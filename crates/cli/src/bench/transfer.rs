//! Placeholder until the transfer benchmark lands (owned by the transfer work).

#[derive(Debug, clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("the transfer benchmark is not built yet")
}
