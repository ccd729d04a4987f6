# EVOLVE-BLOCK-START
def schedule(instance):
    """Deal the jobs out to the machines in the order given: valid, and good at neither objective."""
    machines = [[] for _ in range(instance["machines"])]
    for j in range(len(instance["jobs"])):
        machines[j % len(machines)].append(j)
    return machines
# EVOLVE-BLOCK-END
