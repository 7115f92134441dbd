/* The JSON API as the dashboard calls it: the key the user typed, kept in sessionStorage
   (this tab only, gone when it closes) and sent as "Authorization: Bearer <key>". */
"use strict";
(function () {
  const KEY = "bucketsearch.key";

  class ApiError extends Error {
    constructor(status, detail, path) {
      super(`${status} ${detail}`);
      this.status = status;
      this.detail = detail;
      this.path = path;
    }
    get isAuth() { return this.status === 401 || this.status === 403; }
  }

  /** The server's {"detail": ...} (a string, or FastAPI's list of field errors) as one line. */
  function detailText(data, fallback) {
    if (data && typeof data === "object" && "detail" in data) {
      const d = data.detail;
      if (typeof d === "string") return d;
      if (Array.isArray(d)) {
        return d.map((e) => `${(e.loc || []).join(".")}: ${e.msg || JSON.stringify(e)}`)
          .join("; ");
      }
      return JSON.stringify(d);
    }
    return typeof data === "string" && data ? data.slice(0, 300) : fallback;
  }

  const api = {
    key() { return sessionStorage.getItem(KEY); },
    setKey(key) { sessionStorage.setItem(KEY, key); },
    forgetKey() { sessionStorage.removeItem(KEY); },

    async request(method, path, body) {
      const headers = { Accept: "application/json" };
      const key = api.key();
      if (key) headers.Authorization = `Bearer ${key}`;
      const init = { method, headers, cache: "no-store" };
      if (body !== undefined) {
        headers["Content-Type"] = "application/json";
        init.body = JSON.stringify(body);
      }
      let response;
      try {
        response = await fetch(path, init);
      } catch (err) {
        throw new ApiError(0, `the server did not answer (${err.message})`, path);
      }
      const text = await response.text();
      let data = null;
      try { data = text ? JSON.parse(text) : null; } catch (_) { data = text; }
      if (!response.ok) {
        throw new ApiError(response.status, detailText(data, response.statusText), path);
      }
      return data;
    },
    get(path) { return api.request("GET", path); },
    post(path, body) { return api.request("POST", path, body); },
  };

  window.bs = Object.assign(window.bs || {}, { api, ApiError });
})();
