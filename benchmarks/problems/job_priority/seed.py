# EVOLVE-BLOCK-START
def priority(job):
    """The machine runs the jobs in increasing priority (ties keep the given order).
    job = {"time": processing time, "urgent": True or False, "due": due date}. The seed keeps the given order."""
    return 0
# EVOLVE-BLOCK-END


def schedule(jobs):
    """Fixed: the order the machine runs the jobs in."""
    return sorted(range(len(jobs)), key=lambda i: priority(dict(jobs[i])))
