// SPDX-License-Identifier: Apache-2.0
// Test contracts for Sluice's EVM ingester: just enough of ERC-20, ERC-721, ERC-1155 and a
// Uniswap-V2-style pair to emit the events real ones emit. Not for any other use.
pragma solidity ^0.8.20;

contract TestToken {
    string public name;
    string public symbol;
    uint8 public decimals;
    mapping(address => uint256) public balanceOf;
    mapping(address => mapping(address => uint256)) public allowance;

    event Transfer(address indexed from, address indexed to, uint256 value);
    event Approval(address indexed owner, address indexed spender, uint256 value);

    constructor(string memory name_, string memory symbol_, uint8 decimals_) {
        name = name_;
        symbol = symbol_;
        decimals = decimals_;
    }

    function mint(address to, uint256 value) external {
        balanceOf[to] += value;
        emit Transfer(address(0), to, value);
    }

    /// One Transfer per recipient (the ingest benchmark makes many transfers with few transactions).
    function mintMany(address[] calldata to, uint256 value) external {
        for (uint256 i = 0; i < to.length; i++) {
            balanceOf[to[i]] += value;
            emit Transfer(address(0), to[i], value);
        }
    }

    function transfer(address to, uint256 value) external returns (bool) {
        balanceOf[msg.sender] -= value;
        balanceOf[to] += value;
        emit Transfer(msg.sender, to, value);
        return true;
    }

    function approve(address spender, uint256 value) external returns (bool) {
        allowance[msg.sender][spender] = value;
        emit Approval(msg.sender, spender, value);
        return true;
    }

    function transferFrom(address from, address to, uint256 value) external returns (bool) {
        if (from != msg.sender) {
            allowance[from][msg.sender] -= value;
        }
        balanceOf[from] -= value;
        balanceOf[to] += value;
        emit Transfer(from, to, value);
        return true;
    }
}

/// An ERC-20 without name(), symbol() or decimals(), as many real tokens are.
contract BareToken {
    mapping(address => uint256) public balanceOf;

    event Transfer(address indexed from, address indexed to, uint256 value);

    function mint(address to, uint256 value) external {
        balanceOf[to] += value;
        emit Transfer(address(0), to, value);
    }

    function transfer(address to, uint256 value) external returns (bool) {
        balanceOf[msg.sender] -= value;
        balanceOf[to] += value;
        emit Transfer(msg.sender, to, value);
        return true;
    }
}

contract TestNft {
    string public name = "Test Kittens";
    string public symbol = "KIT";
    mapping(uint256 => address) public ownerOf;

    event Transfer(address indexed from, address indexed to, uint256 indexed tokenId);

    function mint(address to, uint256 tokenId) external {
        require(ownerOf[tokenId] == address(0), "minted");
        ownerOf[tokenId] = to;
        emit Transfer(address(0), to, tokenId);
    }

    function transferFrom(address from, address to, uint256 tokenId) external {
        require(ownerOf[tokenId] == from && from == msg.sender, "not owner");
        ownerOf[tokenId] = to;
        emit Transfer(from, to, tokenId);
    }
}

contract TestMulti {
    mapping(uint256 => mapping(address => uint256)) public balanceOf;

    event TransferSingle(address indexed operator, address indexed from, address indexed to, uint256 id, uint256 value);
    event TransferBatch(address indexed operator, address indexed from, address indexed to, uint256[] ids, uint256[] values);

    function mint(address to, uint256 id, uint256 value) external {
        balanceOf[id][to] += value;
        emit TransferSingle(msg.sender, address(0), to, id, value);
    }

    function safeBatchTransferFrom(address from, address to, uint256[] calldata ids, uint256[] calldata values) external {
        require(from == msg.sender && ids.length == values.length, "bad batch");
        for (uint256 i = 0; i < ids.length; i++) {
            balanceOf[ids[i]][from] -= values[i];
            balanceOf[ids[i]][to] += values[i];
        }
        emit TransferBatch(msg.sender, from, to, ids, values);
    }
}

/// Uniswap V2's pair mechanics without fees' subtleties: tokens are sent to the pair first,
/// then `swap` pays out, emits Sync (new reserves) and Swap.
contract TestPair {
    address public token0;
    address public token1;
    uint112 private reserve0;
    uint112 private reserve1;

    event Sync(uint112 reserve0, uint112 reserve1);
    event Swap(address indexed sender, uint256 amount0In, uint256 amount1In, uint256 amount0Out, uint256 amount1Out, address indexed to);

    constructor(address token0_, address token1_) {
        token0 = token0_;
        token1 = token1_;
    }

    function sync() external {
        reserve0 = uint112(TestToken(token0).balanceOf(address(this)));
        reserve1 = uint112(TestToken(token1).balanceOf(address(this)));
        emit Sync(reserve0, reserve1);
    }

    function swap(uint256 amount0Out, uint256 amount1Out, address to) external {
        _swap(amount0Out, amount1Out, to);
    }

    /// A router's work in the same transaction, as Uniswap's router does it: pull the input
    /// tokens from the caller (who approved the pair), then swap.
    function swapFrom(uint256 amount0In, uint256 amount1In, uint256 amount0Out, uint256 amount1Out, address to) external {
        if (amount0In > 0) TestToken(token0).transferFrom(msg.sender, address(this), amount0In);
        if (amount1In > 0) TestToken(token1).transferFrom(msg.sender, address(this), amount1In);
        _swap(amount0Out, amount1Out, to);
    }

    function _swap(uint256 amount0Out, uint256 amount1Out, address to) private {
        if (amount0Out > 0) TestToken(token0).transfer(to, amount0Out);
        if (amount1Out > 0) TestToken(token1).transfer(to, amount1Out);
        uint256 balance0 = TestToken(token0).balanceOf(address(this));
        uint256 balance1 = TestToken(token1).balanceOf(address(this));
        uint256 amount0In = balance0 > reserve0 - amount0Out ? balance0 - (reserve0 - amount0Out) : 0;
        uint256 amount1In = balance1 > reserve1 - amount1Out ? balance1 - (reserve1 - amount1Out) : 0;
        reserve0 = uint112(balance0);
        reserve1 = uint112(balance1);
        emit Sync(reserve0, reserve1);
        emit Swap(msg.sender, amount0In, amount1In, amount0Out, amount1Out, to);
    }
}

/// Uniswap V3's `Swap` event without its math: the caller names the amounts (positive: into
/// the pool, pulled from the caller, who approved it; negative: paid out to `to`) and the
/// price state the event reports. The pool's balances are its real reserves.
contract TestPoolV3 {
    address public token0;
    address public token1;

    event Swap(address indexed sender, address indexed recipient, int256 amount0, int256 amount1, uint160 sqrtPriceX96, uint128 liquidity, int24 tick);

    constructor(address token0_, address token1_) {
        token0 = token0_;
        token1 = token1_;
    }

    function swap(int256 amount0, int256 amount1, address to, uint160 sqrtPriceX96, uint128 liquidity, int24 tick) external {
        if (amount0 < 0) TestToken(token0).transfer(to, uint256(-amount0));
        if (amount1 < 0) TestToken(token1).transfer(to, uint256(-amount1));
        if (amount0 > 0) TestToken(token0).transferFrom(msg.sender, address(this), uint256(amount0));
        if (amount1 > 0) TestToken(token1).transferFrom(msg.sender, address(this), uint256(amount1));
        emit Swap(msg.sender, to, amount0, amount1, sqrtPriceX96, liquidity, tick);
    }
}
