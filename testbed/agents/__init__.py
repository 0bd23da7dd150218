"""Programs that run inside a node, and what they share with the controller.

- bootstrap: the one way every backend starts a command in a node (enter, prepare, exec)
- delayline: the userspace delay line (nfqueue) for kernels without netem, and how it is started and steered
- router: a docker DC router (shapes its links like the netns backend), and what a node container idles in
- probe: the RTT and goodput agent the probe and the runner's calibration start in nodes
- realtime: SCHED_FIFO for the agents whose timing is the measurement (the delay line's worker, the probe)
- tc, kernel: tc trees through pyroute2 and one line for a missing kernel feature (the router applies them in
  its container, the netns backend from the controller)

Agents import only the standard library, testbed's own standard-library modules and the plan's data (the
router also pyroute2): they start fast and run wherever a node is (a namespace, a container, an ssh host).
The fabric starts them; they never import the fabric.
"""
