// configurable-http-proxy (CHP) with one change: a request whose target CHP cannot
// route, because it does not parse as a URL (http://[, //%E0, a port past 65535) or its
// path does not decode (a malformed percent-encoding such as /hub/%E0%A4%A or /%), gets
// 400 Bad Request, with the hub's error page, instead of 500. CHP parses and decodes the
// target to find its route and lets the error become a 500 (configproxy.js,
// targetForReq); the check below is that same expression.
//
//
// And two more, for the client-address rule (issue 22 row 7, docs/security.md):
//
// - The hub's mark. Every request CHP forwards to the hub's route (the route JupyterHub
//   adds with data {hub: true}) carries the header X-Backendai-Proxy-Secret with the
//   secret the hub handed this process in BACKENDAI_PROXY_SECRET (made afresh at every
//   start); the header a client sent is removed from every request, whatever its route.
//   So the hub believes X-Forwarded-For from this proxy only, never from another process
//   that connects to the hub's port, and no user's server ever sees the secret.
// - A user's allowed client addresses. JupyterHub's routes to users' servers carry the
//   user's allowed_client_ip in their data (backendai_allowed_client_ip, kept current by
//   jupyterhub_backendai.proxy); a request or websocket from another address gets 403
//   with the reason in words, before it reaches the server. The client address is the
//   socket peer's, or, behind the app front (BACKENDAI_PROXY_FRONT_HOPS=1: nginx on
//   loopback in front of CHP), the X-Forwarded-For entry nginx appended.
//
// Usage: node chp-guard.js <CHP's bin script, symlinks resolved> [CHP's arguments...]
// The hub's packaged config runs CHP this way (jupyterhub_backendai/launcher.py,
// chp_command). A CHP without the method this wraps runs unchanged, with a warning.
"use strict";

const net = require("net");
const path = require("path");

const SECRET_HEADER = "x-backendai-proxy-secret"; // clientaddr.SECRET_HEADER, lower-cased
const ALLOWED_KEY = "backendai_allowed_client_ip"; // jupyterhub_backendai.proxy.ALLOWED_KEY
const secret = process.env.BACKENDAI_PROXY_SECRET || "";
delete process.env.BACKENDAI_PROXY_SECRET; // nothing this process starts inherits it
const frontHops = Math.max(0, parseInt(process.env.BACKENDAI_PROXY_FRONT_HOPS || "0", 10) || 0);

function plainAddress(addr) {
  addr = String(addr || "").trim().replace(/^\[|\]$/g, "");
  return addr.toLowerCase().startsWith("::ffff:") && net.isIPv4(addr.slice(7)) ? addr.slice(7) : addr;
}

function loopback(addr) {
  return addr === "::1" || (net.isIPv4(addr) && addr.startsWith("127."));
}

// The client's address: the socket's peer; behind the app front (nginx on loopback), the
// X-Forwarded-For entry it appended (entries further left are the client's own words).
function clientAddress(req) {
  const peer = plainAddress(req.socket && req.socket.remoteAddress);
  if (frontHops === 0 || !loopback(peer)) return peer;
  const hops = String(req.headers["x-forwarded-for"] || "")
    .split(",").map((h) => h.trim()).filter((h) => h);
  if (hops.length < frontHops) return peer;
  const entry = plainAddress(hops[hops.length - frontHops]);
  return net.isIP(entry) ? entry : peer;
}

const blockLists = new Map();

function allowList(allowed) {
  const key = JSON.stringify(allowed);
  let list = blockLists.get(key);
  if (list === undefined) {
    list = new net.BlockList();
    for (const item of allowed) {
      const [addr, bits] = String(item).split("/");
      const type = net.isIPv6(addr) ? "ipv6" : net.isIPv4(addr) ? "ipv4" : null;
      if (type === null) continue;
      const prefix = bits === undefined ? (type === "ipv4" ? 32 : 128) : parseInt(bits, 10);
      try {
        list.addSubnet(addr, prefix, type);
      } catch (e) {
        // not a network: skipped, as the hub skips it
      }
    }
    if (blockLists.size > 10000) blockLists.clear();
    blockLists.set(key, list);
  }
  return list;
}

function allowed(allowedIps, addr) {
  const type = net.isIPv6(addr) ? "ipv6" : net.isIPv4(addr) ? "ipv4" : null;
  return type !== null && allowList(allowedIps).check(addr, type);
}

function refuse(kind, res, message) {
  const body = message + "\n";
  if (kind === "web") {
    res.writeHead(403, {
      "Content-Type": "text/plain; charset=utf-8",
      "Cache-Control": "no-store",
      "Content-Length": Buffer.byteLength(body),
    });
    res.end(body);
  } else {
    // a websocket upgrade: res is the client's socket
    res.end("HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain; charset=utf-8\r\n" +
      `Content-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`);
  }
}

const bin = process.argv[2];
process.argv.splice(2, 1); // CHP reads its own arguments from process.argv

function routable(url) {
  try {
    decodeURIComponent(new URL(url, "http://example.com").pathname);
    return true;
  } catch (e) {
    return false; // TypeError (not a URL) or URIError (does not decode): CHP's 500
  }
}

try {
  const { ConfigurableProxy } = require(path.join(path.dirname(bin), "..", "lib", "configproxy.js"));
  const handleProxy = ConfigurableProxy.prototype.handleProxy;
  if (typeof handleProxy !== "function" || typeof ConfigurableProxy.prototype.handleProxyError !== "function") {
    throw new Error("this CHP has no ConfigurableProxy.handleProxy/handleProxyError");
  }
  if (typeof ConfigurableProxy.prototype.targetForReq !== "function") {
    throw new Error("this CHP has no ConfigurableProxy.targetForReq");
  }
  // The route is looked up once per request: the check below finds it and hands it to
  // CHP's own handleProxy, which would otherwise look it up again.
  const targetForReq = ConfigurableProxy.prototype.targetForReq;
  const FOUND = Symbol("chp-guard: the route found for this request");
  ConfigurableProxy.prototype.targetForReq = function (req) {
    if (Object.prototype.hasOwnProperty.call(req, FOUND)) {
      const match = req[FOUND];
      delete req[FOUND];
      return Promise.resolve(match);
    }
    return targetForReq.call(this, req);
  };
  ConfigurableProxy.prototype.handleProxy = async function (kind, req, res, ...rest) {
    delete req.headers[SECRET_HEADER]; // a client's word: never passed on, never believed
    if (!routable(req.url)) {
      return this.handleProxyError(400, kind, req, res);
    }
    try {
      const match = await targetForReq.call(this, req);
      req[FOUND] = match;
      const data = match ? await this._routes.get(match.prefix) : null;
      if (data && data.hub === true) {
        if (secret) req.headers[SECRET_HEADER] = secret;
      } else if (data && data.user && Array.isArray(data[ALLOWED_KEY]) && data[ALLOWED_KEY].length) {
        const addr = clientAddress(req);
        if (!allowed(data[ALLOWED_KEY], addr)) {
          this.log.warn("403 %s %s: %s is outside the allowed_client_ip of user %s",
            req.method, match.prefix, addr, data.user);
          return refuse(kind, res, `Not allowed from this address: client address ${addr} ` +
            `is not allowed for user '${data.user}' (its allowed_client_ip).`);
        }
      }
    } catch (e) {
      this.log.error("chp-guard: %s", e);
      return this.handleProxyError(500, kind, req, res);
    }
    return handleProxy.call(this, kind, req, res, ...rest);
  };
} catch (e) {
  console.error(`chp-guard: running configurable-http-proxy unchanged (${e.message})`);
}

require(bin);
