"""Real hosts over SSH (paramiko): connections with verified host keys, remote commands, host checks."""
