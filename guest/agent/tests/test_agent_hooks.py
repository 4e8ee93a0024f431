"""What files_server.py and net_relay.py add to the agent (agent.py): the proxy environment of
bash and the Python REPL. (The ports themselves exist only in a VM; see test_files_server.py
and test_net_relay.py for the servers.)
Run from the repository root:  python3 -m unittest discover -s guest/agent/tests -v
"""

import unittest

from agent_harness import AgentTestCase


class ProxyEnvironment(AgentTestCase):
    def test_bash_and_python_go_out_through_the_relay_by_default(self):
        result = self.run_ok("echo $HTTPS_PROXY $http_proxy $no_proxy", "bash")
        self.assertEqual(result.stdout, ["http://127.0.0.1:3128 http://127.0.0.1:3128 "
                                         "localhost,127.0.0.1,::1"])
        result = self.run_ok("import urllib.request\nurllib.request.getproxies()['https']")
        self.assertEqual(result.stdout, ["'http://127.0.0.1:3128'"])


if __name__ == "__main__":
    unittest.main()
