"""VM test canary: listens on TCP and UDP ports on every address (dual-stack)
and logs each hit as one line on stdout (the journal):

    CANARY <role> <proto> <local addr:port> from <peer addr:port> <payload>

TCP answers like an HTTP server (a POST to /v1/messages gets a scripted
model-API reply); UDP echoes; with --dns, port 53 answers NXDOMAIN and logs
the queried name. Standard library only.
"""

import argparse
import json
import socket
import struct
import sys
import threading


def log(role, proto, local, peer, payload):
    text = payload.decode("utf-8", "replace").replace("\n", "\\n").replace("\r", "\\r")
    print(f"CANARY {role} {proto} {local[0]}:{local[1]} from {peer[0]}:{peer[1]} {text[:512]}", flush=True)


def model_reply():
    body = json.dumps({
        "id": "msg_shrooms_test",
        "type": "message",
        "role": "assistant",
        "model": "shrooms-test",
        "content": [{"type": "text", "text": "scripted reply from the test internet"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 1, "output_tokens": 1},
    }).encode()
    return b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


def dns_name(q):
    labels, i = [], 12
    while i < len(q) and q[i] != 0:
        n = q[i]
        labels.append(q[i + 1:i + 1 + n].decode("ascii", "replace"))
        i += 1 + n
    return ".".join(labels), i + 5


def dns_nxdomain(q):
    if len(q) < 12:
        return b""
    _, end = dns_name(q)
    flags = 0x8183  # response, recursion desired + available, NXDOMAIN
    return q[:2] + struct.pack(">HHHHH", flags, 1, 0, 0, 0) + q[12:end]


def serve_tcp(role, port, dns):
    s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    s.bind(("::", port))
    s.listen(64)
    while True:
        c, peer = s.accept()
        threading.Thread(target=handle_tcp, args=(role, port, dns, c, peer), daemon=True).start()


def handle_tcp(role, port, dns, c, peer):
    with c:
        c.settimeout(3)
        local = c.getsockname()
        data = b""
        try:
            while b"\r\n\r\n" not in data and len(data) < 4096:
                chunk = c.recv(4096)
                if not chunk:
                    break
                data += chunk
        except OSError:
            pass
        if dns and port == 53 and len(data) > 2:
            name, _ = dns_name(data[2:])
            log(role, "dns-tcp", local, peer, name.encode())
            reply = dns_nxdomain(data[2:])
            c.sendall(struct.pack(">H", len(reply)) + reply)
            return
        log(role, "tcp", local, peer, data)
        if data.startswith(b"POST /v1/messages"):
            c.sendall(model_reply())
        else:
            body = f"canary {role}\n".encode()
            c.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))


def serve_udp(role, port, dns):
    s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    s.bind(("::", port))
    while True:
        data, peer = s.recvfrom(65535)
        local = ("::", port)
        if dns and port == 53:
            name, _ = dns_name(data)
            log(role, "dns", local, peer, name.encode())
            s.sendto(dns_nxdomain(data), peer)
            continue
        log(role, "udp", local, peer, data)
        s.sendto(f"canary {role}\n".encode(), peer)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--role", required=True)
    ap.add_argument("--tcp", default="")
    ap.add_argument("--udp", default="")
    ap.add_argument("--dns", action="store_true")
    a = ap.parse_args()
    threads = []
    for p in filter(None, a.tcp.split(",")):
        threads.append(threading.Thread(target=serve_tcp, args=(a.role, int(p), a.dns), daemon=True))
    for p in filter(None, a.udp.split(",")):
        threads.append(threading.Thread(target=serve_udp, args=(a.role, int(p), a.dns), daemon=True))
    for t in threads:
        t.start()
    print(f"CANARY {a.role} listening tcp={a.tcp} udp={a.udp}", flush=True)
    for t in threads:
        t.join()
    sys.exit(1)


if __name__ == "__main__":
    main()
