"""The calibrated cost model: predict a cell, plan a configuration, what-if at real scale.

Plain functions over plain data; imports testbed.spec and testbed.plan (pure), never torch, the fabric or the
runner. shapes: what the workload moves and computes; network: routed paths; transport: a transport's
parameters and TCP's window; host: the machine's CPU as a bound on collectives of more ranks than cores;
collectives: gloo's ring and transfers simulated, bytes in closed form;
strategies: one predictor per strategy (PREDICTORS); calibration: fitting the transport to micro-benchmarks;
predict: cells of an experiment or a run; planner: `testbed plan` and its search; whatif: closed forms at scale;
commands: what the CLI calls.
"""
