"""Settings of the packer."""


# EVOLVE-BLOCK-START
def fill_fraction():
    """The share of the capacity the packer may fill (1.0: all of it)."""
    return 0.6


# EVOLVE-BLOCK-END
