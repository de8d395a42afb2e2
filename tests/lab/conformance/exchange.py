"""Send requests to an engine and return its answers byte for byte; run on a lab host.

    python3 exchange.py < {"url": "http://127.0.0.1:8000", "requests": [...]}

Each request is a functional probe's, as engine_probe takes it (method, path, body or
raw_body, timeout, concurrent, repeat). Prints one JSON document: per request
its name and the answers of its copies, each the status, the Content-Type and the whole body
as text, so the conformance test reads every server-sent event, not what the collection's own
client keeps of them. Standard library only: it runs on the host's Python, beside each engine.
"""

import http.client
import json
import sys
import threading
import urllib.parse


def expand_repeats(value):
    """The body with every {"$repeat": text, "times": N} made the repeated text here, as
    engine_probe does, so long prompts never travel over ssh."""
    if isinstance(value, dict):
        if set(value) == {"$repeat", "times"}:
            return str(value["$repeat"]) * int(value["times"])
        return {key: expand_repeats(item) for key, item in value.items()}
    if isinstance(value, list):
        return [expand_repeats(item) for item in value]
    return value


def send(url, request):
    parsed = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parsed.hostname, parsed.port,
                                            timeout=float(request.get("timeout", 60)))
    if "raw_body" in request:
        payload = request["raw_body"].encode()
    elif "body" in request:
        payload = json.dumps(expand_repeats(request["body"])).encode()
    else:
        payload = None
    headers = {"Content-Type": "application/json"} if payload is not None else {}
    try:
        connection.request(request.get("method", "GET"), request["path"], body=payload,
                           headers=headers)
        response = connection.getresponse()
        return {"status": response.status, "content_type": response.getheader("Content-Type"),
                "text": response.read().decode("utf-8", "replace")}
    except OSError as error:
        return {"status": None, "content_type": None, "text": "", "error": str(error)}
    finally:
        connection.close()


def answers(url, request):
    """Every copy's answer: `repeat` one after another, each of `concurrent` copies at once."""
    found = []
    for _round in range(int(request.get("repeat", 1))):
        copies = [None] * int(request.get("concurrent", 1))

        def one(index):
            copies[index] = send(url, request)

        threads = [threading.Thread(target=one, args=(index,)) for index in range(len(copies))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        found.extend(copies)
    return found


def main():
    job = json.load(sys.stdin)
    json.dump([{"name": request["name"], "answers": answers(job["url"], request)}
               for request in job["requests"]], sys.stdout)


if __name__ == "__main__":
    main()
