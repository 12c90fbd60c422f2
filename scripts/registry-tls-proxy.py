"""The test stack's secured schema registry: HTTPS (the stack's CA) with HTTP basic
authentication in front of the plaintext Apicurio registry, as a company's gateway puts
it. Started by scripts/services.sh (service registry-tls); standard library only.

usage: registry-tls-proxy.py LISTEN_HOST LISTEN_PORT BACKEND_URL CERT KEY CREDENTIALS_FILE

CREDENTIALS_FILE holds one line, user:password. A request without them, or with others,
gets 401 and never reaches the registry. Nothing secret is logged.
"""

import base64
import hmac
import http.client
import ssl
import sys
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
              "trailers", "transfer-encoding", "upgrade", "host", "authorization", "content-length"}


def main():
    host, port, backend, cert, key, credentials_file = sys.argv[1:7]
    expected = "Basic " + base64.b64encode(open(credentials_file).read().strip().encode()).decode()
    target = urllib.parse.urlsplit(backend)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):  # the request line only; never headers
            sys.stderr.write("registry-tls: %s %s\n" % (self.address_string(), fmt % args))

        def refuse(self):
            body = b'{"error_code":401,"message":"Unauthorized"}'
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="Caudal test stack registry"')
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def forward(self):
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            given = self.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), expected.encode()):
                self.refuse()
                return
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
            conn = http.client.HTTPConnection(target.hostname, target.port, timeout=60)
            try:
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
            except OSError as e:
                data = ('{"error_code":502,"message":"registry unreachable: %s"}' % e).encode()
                self.send_response(502)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            finally:
                conn.close()
            self.send_response(resp.status)
            for k, v in resp.getheaders():
                if k.lower() not in HOP_BY_HOP:
                    self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_DELETE = forward

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    class Server(ThreadingHTTPServer):
        daemon_threads = True

        def handle_error(self, request, client_address):  # one line, not a traceback
            sys.stderr.write("registry-tls: %s: %s\n" % (client_address[0], sys.exc_info()[1]))

    server = Server((host, int(port)), Handler)
    # The handshake happens in the connection's own thread, at its first read.
    server.socket = context.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
    sys.stderr.write("registry-tls: https://%s:%s -> %s\n" % (host, port, backend))
    sys.stderr.flush()
    server.serve_forever()


if __name__ == "__main__":
    main()
