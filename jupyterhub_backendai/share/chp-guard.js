// configurable-http-proxy (CHP) with one change: a request whose target CHP cannot
// route, because it does not parse as a URL (http://[, //%E0, a port past 65535) or its
// path does not decode (a malformed percent-encoding such as /hub/%E0%A4%A or /%), gets
// 400 Bad Request, with the hub's error page, instead of 500. CHP parses and decodes the
// target to find its route and lets the error become a 500 (configproxy.js,
// targetForReq); the check below is that same expression.
//
// Usage: node chp-guard.js <CHP's bin script, symlinks resolved> [CHP's arguments...]
// The hub's packaged config runs CHP this way (jupyterhub_backendai/launcher.py,
// chp_command). A CHP without the method this wraps runs unchanged, with a warning.
"use strict";

const path = require("path");

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
  ConfigurableProxy.prototype.handleProxy = function (kind, req, res, ...rest) {
    if (!routable(req.url)) {
      return this.handleProxyError(400, kind, req, res);
    }
    return handleProxy.call(this, kind, req, res, ...rest);
  };
} catch (e) {
  console.error(`chp-guard: running configurable-http-proxy unchanged (${e.message})`);
}

require(bin);
