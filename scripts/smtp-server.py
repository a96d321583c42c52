#!/usr/bin/env python3
"""A small real SMTP server (aiosmtpd) for the SMTP connector's tests.

Every accepted message is written to DIR as <n>.eml (the data as received)
and <n>.json (envelope: mail_from, rcpt_tos). The files appear atomically,
so a reader never sees half a message.

    python3 scripts/smtp-server.py --port 0 --dir DIR \
        [--drop-after-data] [--reject-recipient a@example.com ...]

--drop-after-data  write the message, then close the connection without
                   the final reply: the client cannot know it was taken.
--reject-recipient answer RCPT TO for this address with 550.

Once listening it prints "listening on HOST:PORT" on stdout.
Needs aiosmtpd: pip install aiosmtpd
"""

import argparse
import asyncio
import itertools
import json
import os
import signal
import sys

try:
    from aiosmtpd.smtp import SMTP
except ImportError:
    sys.exit("aiosmtpd is missing: run `pip install aiosmtpd`")


class Recorder:
    """aiosmtpd handler: records messages, applies the chosen faults."""

    def __init__(self, directory, drop_after_data, rejected):
        self.directory = directory
        self.drop_after_data = drop_after_data
        self.rejected = {address.lower() for address in rejected}
        self.counter = itertools.count(1)

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):
        if address.lower() in self.rejected:
            return f"550 5.1.1 <{address}>: Recipient address rejected: User unknown"
        envelope.rcpt_tos.append(address)
        return "250 2.1.5 OK"

    async def handle_DATA(self, server, session, envelope):
        number = next(self.counter)
        self.write(f"{number}.json", json.dumps(
            {"mail_from": envelope.mail_from, "rcpt_tos": envelope.rcpt_tos}
        ).encode())
        self.write(f"{number}.eml", envelope.original_content)
        if self.drop_after_data:
            # The message is kept; the reply never comes.
            server.transport.abort()
            await asyncio.Event().wait()
        return "250 2.0.0 OK: queued"

    def write(self, name, data):
        final = os.path.join(self.directory, name)
        partial = final + ".part"
        with open(partial, "wb") as out:
            out.write(data)
        os.replace(partial, final)


async def serve(args):
    os.makedirs(args.dir, exist_ok=True)
    handler = Recorder(args.dir, args.drop_after_data, args.reject_recipient)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: SMTP(handler, hostname="aiosmtpd.test", enable_SMTPUTF8=True),
        host=args.host,
        port=args.port,
    )
    host, port = server.sockets[0].getsockname()[:2]
    print(f"listening on {host}:{port}", flush=True)
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    async with server:
        await stop.wait()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--dir", required=True, help="where messages are written")
    parser.add_argument("--drop-after-data", action="store_true")
    parser.add_argument("--reject-recipient", action="append", default=[])
    asyncio.run(serve(parser.parse_args()))


if __name__ == "__main__":
    main()
